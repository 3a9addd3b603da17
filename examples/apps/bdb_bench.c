/*
 * bdb_bench.c: Berkeley DB transactions, the shape of Moneta-D's BerkeleyDB workloads (Table 3).
 *
 * An environment with transactions, logging, locking and a buffer pool in DIR holds one database
 * (a B-tree or a hash table) of RECORDS records, 64-byte keys and 256-byte values, loaded in
 * batched transactions. Then random-key read-modify-write updates run, one per transaction,
 * each committed with the default durability (the log is written and flushed on commit), for a
 * number of seconds or of operations. One line of JSON goes to standard output:
 *
 *   {"workload":"bdb-btree","ops":N,"seconds":S,"ops_per_s":X,"p50_us":P,...}
 *
 * Every value carries its record's number and an update count, and the rest of its bytes are a
 * function of both, so `--verify` (on the same DIR, later, by another process, possibly after
 * copying DIR elsewhere) reads every record back, checks it, and prints the sum of the update
 * counts, which equals the number of updates committed.
 *
 * Build:  cc -O2 -Wall -Wextra -Werror examples/apps/bdb_bench.c -ldb -o bdb_bench
 *         (Debian: libdb-dev)
 * Run:    bdb_bench [--kind btree|hash] [--records N] [--seconds S | --ops N] [--cache-mb M]
 *                   [--seed N] DIR
 *         bdb_bench --verify [--kind btree|hash] [--records N] DIR
 *
 * The environment is private to the process (DB_PRIVATE: its regions live in the heap, not in
 * shared files), and the buffer pool never maps database files (DB_NOMMAP): Moneta files cannot
 * be memory-mapped yet, and every target then does the same work. Files are opened without
 * O_DIRECT: Debian's libdb is built without direct I/O (DB_DIRECT_DB and DB_LOG_DIRECT answer
 * EINVAL), so on a kernel file system the page cache is in the path and each commit's flush goes
 * through it to the device.
 * Exit status 0 on success; otherwise a message on standard error and exit 1 (2 for usage).
 */
#define _DEFAULT_SOURCE /* u_int and u_long, which db.h uses */
#include <db.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <time.h>

#define KEY_LEN 64
#define VALUE_LEN 256
/* Records loaded per transaction. */
#define LOAD_BATCH 500
/* A checkpoint every this many updates, so DB_LOG_AUTO_REMOVE can drop old log files and a
 * long run does not fill a small array with log. The same on every target. */
#define CHECKPOINT_EVERY 20000
/* Latency samples kept for the median (the first ones of a longer run). */
#define MAX_SAMPLES (1u << 20)
/* Upper bounds on the arguments: a typo must not ask for a terabyte. */
#define MAX_RECORDS 100000000ull
#define MAX_SECONDS 86400.0

static const char *prog = "bdb_bench";

static void die(const char *what, int ret) {
    fprintf(stderr, "%s: %s: %s\n", prog, what, db_strerror(ret));
    exit(1);
}

static void fail(const char *msg) {
    fprintf(stderr, "%s: %s\n", prog, msg);
    exit(1);
}

static void usage(void) {
    fprintf(stderr,
            "usage: %s [--kind btree|hash] [--records N] [--seconds S | --ops N] [--cache-mb M]\n"
            "          [--seed N] DIR\n"
            "       %s --verify [--kind btree|hash] [--records N] DIR\n",
            prog, prog);
    exit(2);
}

static double now_s(void) {
    struct timespec ts;
    if (clock_gettime(CLOCK_MONOTONIC, &ts) != 0) {
        fail("clock_gettime failed");
    }
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static uint64_t xorshift(uint64_t *s) {
    uint64_t x = *s;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    *s = x;
    return x;
}

static unsigned long long parse_u64(const char *s, unsigned long long max) {
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno != 0 || end == s || *end != '\0' || v > max) {
        fprintf(stderr, "%s: bad number: %s (at most %llu)\n", prog, s, max);
        exit(2);
    }
    return v;
}

static void make_key(unsigned char *key, uint64_t i) {
    memset(key, 0, KEY_LEN);
    snprintf((char *)key, KEY_LEN, "key-%016llu", (unsigned long long)i);
    /* The rest of the key: bytes that depend on the record, so keys are not mostly zeros. */
    for (size_t j = 21; j < KEY_LEN; j++) {
        key[j] = (unsigned char)('a' + (i * 31 + j) % 26);
    }
}

/* Value: record number (8 bytes), update count (8 bytes), then bytes from both. */
static void make_value(unsigned char *v, uint64_t i, uint64_t version) {
    memcpy(v, &i, 8);
    memcpy(v + 8, &version, 8);
    uint64_t s = (i + 1) * 0x9E3779B97F4A7C15ull ^ (version + 1) * 0xBF58476D1CE4E5B9ull;
    for (size_t j = 16; j < VALUE_LEN; j += 8) {
        uint64_t x = xorshift(&s);
        memcpy(v + j, &x, 8);
    }
}

/* Whether v is the value of record i at some update count; that count in *version. */
static int check_value(const unsigned char *v, uint64_t i, uint64_t *version) {
    unsigned char want[VALUE_LEN];
    uint64_t got_i;
    memcpy(&got_i, v, 8);
    memcpy(version, v + 8, 8);
    if (got_i != i) {
        return 0;
    }
    make_value(want, i, *version);
    return memcmp(want, v, VALUE_LEN) == 0;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static DB_ENV *open_env(const char *dir, unsigned cache_mb, int recover) {
    DB_ENV *env;
    int ret = db_env_create(&env, 0);
    if (ret != 0) {
        die("db_env_create", ret);
    }
    env->set_errfile(env, stderr);
    env->set_errpfx(env, prog);
    if ((ret = env->set_cachesize(env, cache_mb / 1024, (cache_mb % 1024) * 1024 * 1024, 1)) != 0) {
        die("set_cachesize", ret);
    }
    /* Enough locks for one loading transaction of LOAD_BATCH records on any page layout. */
    if ((ret = env->set_lk_max_locks(env, 20000)) != 0) {
        die("set_lk_max_locks", ret);
    }
    if ((ret = env->set_lk_max_objects(env, 20000)) != 0) {
        die("set_lk_max_objects", ret);
    }
    if ((ret = env->set_lg_max(env, 4u * 1024 * 1024)) != 0) {
        die("set_lg_max", ret);
    }
    if ((ret = env->set_flags(env, DB_NOMMAP, 1)) != 0) {
        die("set_flags DB_NOMMAP", ret);
    }
    if ((ret = env->log_set_config(env, DB_LOG_AUTO_REMOVE, 1)) != 0) {
        die("log_set_config DB_LOG_AUTO_REMOVE", ret);
    }
    u_int32_t flags = DB_CREATE | DB_PRIVATE | DB_INIT_TXN | DB_INIT_LOG | DB_INIT_LOCK |
                      DB_INIT_MPOOL;
    if (recover) {
        flags |= DB_RECOVER;
    }
    if ((ret = env->open(env, dir, flags, 0600)) != 0) {
        fprintf(stderr, "%s: opening the environment in %s: %s\n", prog, dir, db_strerror(ret));
        exit(1);
    }
    return env;
}

static DB *open_db(DB_ENV *env, DBTYPE type, uint64_t records, int create) {
    DB *db;
    int ret = db_create(&db, env, 0);
    if (ret != 0) {
        die("db_create", ret);
    }
    if (type == DB_HASH && create) {
        if ((ret = db->set_h_nelem(db, (u_int32_t)records)) != 0) {
            die("set_h_nelem", ret);
        }
    }
    u_int32_t flags = DB_AUTO_COMMIT | (create ? DB_CREATE | DB_EXCL : 0);
    if ((ret = db->open(db, NULL, "bench.db", NULL, type, flags, 0600)) != 0) {
        if (ret == EEXIST) {
            fail("bench.db exists already in this directory: give a fresh one, or --verify");
        }
        die("opening bench.db", ret);
    }
    return db;
}

static void close_all(DB_ENV *env, DB *db) {
    int ret;
    if ((ret = db->close(db, 0)) != 0) {
        die("closing the database", ret);
    }
    if ((ret = env->close(env, 0)) != 0) {
        die("closing the environment", ret);
    }
}

static void load(DB_ENV *env, DB *db, uint64_t records) {
    unsigned char key[KEY_LEN], val[VALUE_LEN];
    int ret;
    for (uint64_t i = 0; i < records;) {
        DB_TXN *txn;
        if ((ret = env->txn_begin(env, NULL, &txn, 0)) != 0) {
            die("txn_begin (load)", ret);
        }
        for (uint64_t n = 0; n < LOAD_BATCH && i < records; n++, i++) {
            DBT k, v;
            memset(&k, 0, sizeof k);
            memset(&v, 0, sizeof v);
            make_key(key, i);
            make_value(val, i, 0);
            k.data = key;
            k.size = KEY_LEN;
            v.data = val;
            v.size = VALUE_LEN;
            if ((ret = db->put(db, txn, &k, &v, DB_NOOVERWRITE)) != 0) {
                die("put (load)", ret);
            }
        }
        if ((ret = txn->commit(txn, 0)) != 0) {
            die("commit (load)", ret);
        }
    }
    if ((ret = env->txn_checkpoint(env, 0, 0, 0)) != 0) {
        die("txn_checkpoint", ret);
    }
}

/* One read-modify-write of record i in its own transaction. */
static void update(DB_ENV *env, DB *db, uint64_t i) {
    unsigned char key[KEY_LEN], val[VALUE_LEN];
    DBT k, v;
    DB_TXN *txn;
    int ret;
    uint64_t version;
    if ((ret = env->txn_begin(env, NULL, &txn, 0)) != 0) {
        die("txn_begin", ret);
    }
    memset(&k, 0, sizeof k);
    memset(&v, 0, sizeof v);
    make_key(key, i);
    k.data = key;
    k.size = KEY_LEN;
    v.data = val;
    v.ulen = VALUE_LEN;
    v.flags = DB_DBT_USERMEM;
    /* DB_RMW: take the write lock on the read, as a read-modify-write should. */
    if ((ret = db->get(db, txn, &k, &v, DB_RMW)) != 0) {
        die("get", ret);
    }
    if (v.size != VALUE_LEN || !check_value(val, i, &version)) {
        fail("a record read back is not the one written");
    }
    make_value(val, i, version + 1);
    if ((ret = db->put(db, txn, &k, &v, 0)) != 0) {
        die("put", ret);
    }
    if ((ret = txn->commit(txn, 0)) != 0) {
        die("commit", ret);
    }
}

static int verify(DB *db, uint64_t records, const char *workload) {
    unsigned char key[KEY_LEN], val[VALUE_LEN];
    uint64_t sum = 0;
    int ret;
    double t0 = now_s();
    for (uint64_t i = 0; i < records; i++) {
        DBT k, v;
        uint64_t version;
        memset(&k, 0, sizeof k);
        memset(&v, 0, sizeof v);
        make_key(key, i);
        k.data = key;
        k.size = KEY_LEN;
        v.data = val;
        v.ulen = VALUE_LEN;
        v.flags = DB_DBT_USERMEM;
        if ((ret = db->get(db, NULL, &k, &v, 0)) != 0) {
            fprintf(stderr, "%s: record %llu: %s\n", prog, (unsigned long long)i, db_strerror(ret));
            return 1;
        }
        if (v.size != VALUE_LEN || !check_value(val, i, &version)) {
            fprintf(stderr, "%s: record %llu has the wrong content\n", prog,
                    (unsigned long long)i);
            return 1;
        }
        sum += version;
    }
    /* No record beyond the expected ones. */
    DB_BTREE_STAT *bs = NULL;
    DB_HASH_STAT *hs = NULL;
    uint64_t count;
    if ((ret = db->stat(db, NULL, db->type == DB_BTREE ? (void *)&bs : (void *)&hs, 0)) != 0) {
        die("stat", ret);
    }
    count = bs ? bs->bt_ndata : hs->hash_ndata;
    free(bs);
    free(hs);
    if (count != records) {
        fprintf(stderr, "%s: %llu records, expected %llu\n", prog, (unsigned long long)count,
                (unsigned long long)records);
        return 1;
    }
    printf("{\"workload\":\"%s\",\"verify\":\"ok\",\"records\":%llu,\"updates\":%llu,"
           "\"seconds\":%.6f}\n",
           workload, (unsigned long long)records, (unsigned long long)sum, now_s() - t0);
    return 0;
}

int main(int argc, char **argv) {
    const char *kind = "btree";
    const char *dir = NULL;
    uint64_t records = 20000, ops = 0, seed = 1;
    double seconds = 0;
    unsigned cache_mb = 32;
    int do_verify = 0;

    for (int a = 1; a < argc; a++) {
        const char *o = argv[a];
        int more = a + 1 < argc;
        if (strcmp(o, "--kind") == 0 && more) {
            kind = argv[++a];
        } else if (strcmp(o, "--records") == 0 && more) {
            records = parse_u64(argv[++a], MAX_RECORDS);
        } else if (strcmp(o, "--ops") == 0 && more) {
            ops = parse_u64(argv[++a], UINT64_MAX / 2);
        } else if (strcmp(o, "--seconds") == 0 && more) {
            char *end;
            seconds = strtod(argv[++a], &end);
            if (*end != '\0' || !(seconds > 0) || seconds > MAX_SECONDS) {
                usage();
            }
        } else if (strcmp(o, "--cache-mb") == 0 && more) {
            cache_mb = (unsigned)parse_u64(argv[++a], 65536);
        } else if (strcmp(o, "--seed") == 0 && more) {
            seed = parse_u64(argv[++a], UINT64_MAX / 2);
        } else if (strcmp(o, "--verify") == 0) {
            do_verify = 1;
        } else if (o[0] == '-' || dir != NULL) {
            usage();
        } else {
            dir = o;
        }
    }
    DBTYPE type;
    if (strcmp(kind, "btree") == 0) {
        type = DB_BTREE;
    } else if (strcmp(kind, "hash") == 0) {
        type = DB_HASH;
    } else {
        usage();
    }
    if (dir == NULL || records == 0 || cache_mb == 0 || (ops > 0 && seconds > 0)) {
        usage();
    }
    if (ops == 0 && seconds == 0) {
        seconds = 5;
    }
    char workload[32];
    snprintf(workload, sizeof workload, "bdb-%s", kind);

    if (do_verify) {
        DB_ENV *env = open_env(dir, cache_mb, 1);
        DB *db = open_db(env, type, records, 0);
        int bad = verify(db, records, workload);
        close_all(env, db);
        return bad;
    }

    if (mkdir(dir, 0700) != 0 && errno != EEXIST) {
        fprintf(stderr, "%s: mkdir %s: %s\n", prog, dir, strerror(errno));
        return 1;
    }
    DB_ENV *env = open_env(dir, cache_mb, 0);
    DB *db = open_db(env, type, records, 1);
    double t_load = now_s();
    load(env, db, records);
    double load_s = now_s() - t_load;

    size_t cap = ops > 0 && ops < MAX_SAMPLES ? (size_t)ops : MAX_SAMPLES;
    double *lat = malloc(cap * sizeof *lat);
    if (lat == NULL) {
        fail("out of memory for latency samples");
    }
    uint64_t rng = seed * 0x2545F4914F6CDD1Dull + 1;
    uint64_t done = 0;
    size_t kept = 0;
    double t0 = now_s(), t = t0, end = t0 + seconds;
    while (ops > 0 ? done < ops : t < end) {
        uint64_t i = xorshift(&rng) % records;
        update(env, db, i);
        double t1 = now_s();
        if (kept < cap) {
            lat[kept++] = t1 - t;
        }
        t = t1;
        done++;
        if (done % CHECKPOINT_EVERY == 0) {
            int ret = env->txn_checkpoint(env, 0, 0, 0);
            if (ret != 0) {
                die("txn_checkpoint", ret);
            }
            t = now_s();
        }
    }
    double elapsed = t - t0;
    qsort(lat, kept, sizeof *lat, cmp_double);
    double p50 = kept > 0 ? lat[kept / 2] * 1e6 : 0;
    free(lat);
    close_all(env, db);
    printf("{\"workload\":\"%s\",\"ops\":%llu,\"seconds\":%.6f,\"ops_per_s\":%.1f,"
           "\"p50_us\":%.2f,\"records\":%llu,\"load_seconds\":%.6f}\n",
           workload, (unsigned long long)done, elapsed, elapsed > 0 ? (double)done / elapsed : 0,
           p50, (unsigned long long)records, load_s);
    if (fflush(stdout) != 0) {
        fail("writing the result failed");
    }
    return 0;
}
