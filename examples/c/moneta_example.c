/*
 * moneta_example.c: files on nvfs through libmoneta's C interface, synchronously and
 * asynchronously.
 *
 * Build:  cc -Wall -Wextra -O2 -I include examples/c/moneta_example.c -L target/release \
 *            -lmoneta -Wl,-rpath,$PWD/target/release -o moneta_example
 * Run:    MONETA_SOCKET=/path/to/monetad.sock ./moneta_example
 *
 * Prints "moneta_example: ok" and exits 0 when every check holds; otherwise says which failed
 * and exits 1.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "moneta.h"

#define CHECK(cond)                                                                  \
    do {                                                                             \
        if (!(cond)) {                                                               \
            fprintf(stderr, "moneta_example: %s:%d: check failed: %s (errno %d: %s)\n", \
                    __FILE__, __LINE__, #cond, errno, strerror(errno));              \
            exit(1);                                                                 \
        }                                                                            \
    } while (0)

static unsigned char pattern(size_t i) { return (unsigned char)(i * 7 + (i >> 9)); }

int main(void) {
    struct moneta_conn *m = moneta_connect(NULL); /* $MONETA_SOCKET or the default socket */
    CHECK(m != NULL);

    /* Errors come back as -1 or NULL with errno set. */
    errno = 0;
    CHECK(moneta_open(m, "/no/such/file", O_RDONLY, 0) == NULL && errno == ENOENT);

    /* Synchronous: 1 MiB written and read back, unaligned pieces, vectored calls. */
    struct moneta_file *f = moneta_open(m, "/example.dat", O_CREAT | O_RDWR | O_TRUNC, 0644);
    CHECK(f != NULL);
    size_t size = 1 << 20;
    unsigned char *data = malloc(size), *back = malloc(size);
    CHECK(data && back);
    for (size_t i = 0; i < size; i++) data[i] = pattern(i);
    CHECK(moneta_pwrite(f, data, size, 0) == (ssize_t)size);
    memset(back, 0, size);
    CHECK(moneta_pread(f, back, size, 0) == (ssize_t)size);
    CHECK(memcmp(data, back, size) == 0);
    CHECK(moneta_pread(f, back, 333, 4097) == 333 && memcmp(back, data + 4097, 333) == 0);
    CHECK(moneta_pread(f, back, 100, (int64_t)size) == 0); /* end of file */

    char a[3] = "ab", b[4] = "cde";
    struct iovec wv[2] = {{a, 2}, {b, 3}};
    CHECK(moneta_lseek(f, 10, SEEK_SET) == 10);
    CHECK(moneta_writev(f, wv, 2) == 5);
    char r1[2], r2[3];
    struct iovec rv[2] = {{r1, 2}, {r2, 3}};
    CHECK(moneta_preadv(f, rv, 2, 10) == 5 && memcmp(r1, "ab", 2) == 0 && memcmp(r2, "cde", 3) == 0);
    memcpy(data + 10, "abcde", 5);

    struct moneta_stat st;
    CHECK(moneta_fstat(f, &st) == 0 && st.size == size);
    CHECK(moneta_fsync(f) == 0);

    /* Asynchronous: 64 reads of 4 KiB in flight at once, reaped as they end. */
    enum { N = 64, LEN = 4096 };
    unsigned char *bufs = malloc((size_t)N * LEN);
    CHECK(bufs != NULL);
    struct moneta_req *reqs[N];
    int64_t offs[N];
    for (int i = 0; i < N; i++) {
        offs[i] = (int64_t)(((unsigned)i * 7919u) % (size / LEN)) * LEN + (i % 3);
        reqs[i] = moneta_submit_read(f, bufs + (size_t)i * LEN, LEN, offs[i]);
        CHECK(reqs[i] != NULL);
    }
    for (int k = 0; k < N / 2; k++) {
        size_t idx = 0;
        ssize_t n = moneta_wait_any(reqs, N, &idx);
        CHECK(n >= 0 && reqs[idx] == NULL);
        size_t want = (size_t)offs[idx] + LEN > size ? size - (size_t)offs[idx] : LEN;
        CHECK((size_t)n == want && memcmp(bufs + idx * LEN, data + offs[idx], want) == 0);
    }
    ssize_t results[N] = {0};
    CHECK(moneta_wait_all(reqs, N, results) == 0);
    for (int i = 0; i < N; i++) {
        CHECK(reqs[i] == NULL);
        if (results[i] == 0) continue; /* reaped above by wait_any: slot was NULL */
        CHECK(results[i] > 0 && memcmp(bufs + (size_t)i * LEN, data + offs[i], (size_t)results[i]) == 0);
    }

    /* An asynchronous write, polled; the file cannot close while it is in flight. */
    static const char msg[] = "written asynchronously";
    struct moneta_req *w = moneta_submit_write(f, msg, sizeof msg, (int64_t)size);
    CHECK(w != NULL);
    errno = 0;
    int closed = moneta_close(f);
    CHECK(closed == -1 && errno == EBUSY);
    while (moneta_poll(w) == 0) {
    }
    CHECK(moneta_wait(w) == (ssize_t)sizeof msg);
    char tail[sizeof msg];
    CHECK(moneta_pread(f, tail, sizeof tail, (int64_t)size) == (ssize_t)sizeof msg);
    CHECK(memcmp(tail, msg, sizeof msg) == 0);

    /* Completion policy per file: every mode moves the same bytes. */
    int modes[] = {MONETA_COMPLETION_SPIN, MONETA_COMPLETION_FORWARD, MONETA_COMPLETION_SLEEP};
    for (int i = 0; i < 3; i++) {
        CHECK(moneta_set_completion(f, modes[i], 0) == 0);
        CHECK(moneta_pread(f, back, 65536, 1000) == 65536 && memcmp(back, data + 1000, 65536) == 0);
    }
    CHECK(moneta_set_completion(f, 42, 0) == -1 && errno == EINVAL);

    /* The file's own pages in memory: a store through the mapping is at once what a read
     * sees, and a write at once what the mapping shows. */
    char *map = moneta_map(f, 8192, PROT_READ | PROT_WRITE, MAP_SHARED, 0);
    CHECK(map != MAP_FAILED);
    CHECK(memcmp(map + 1000, data + 1000, 4096) == 0);
    memcpy(map + 5000, "stored", 6);
    CHECK(moneta_pread(f, back, 6, 5000) == 6 && memcmp(back, "stored", 6) == 0);
    CHECK(moneta_pwrite(f, "pwrite", 6, 6000) == 6 && memcmp(map + 6000, "pwrite", 6) == 0);
    memcpy(data + 5000, "stored", 6);
    memcpy(data + 6000, "pwrite", 6);
    CHECK(moneta_msync(map, 8192, MS_SYNC) == 0);
    CHECK(moneta_unmap(map, 8192) == 0);
    errno = 0;
    CHECK(moneta_map(f, 4096, PROT_READ, MAP_SHARED, 100) == MAP_FAILED && errno == EINVAL);

    /* Advice: WILLNEED is a hint to the device; the others have nothing to act on. */
    CHECK(moneta_advise(f, 0, 65536, POSIX_FADV_WILLNEED) == 0);
    CHECK(moneta_advise(f, 0, 0, POSIX_FADV_SEQUENTIAL) == 0);
    CHECK(moneta_advise(f, 0, 10, 99) == -1 && errno == EINVAL);
    CHECK(moneta_pread(f, back, 4096, 4096) == 4096 && memcmp(back, data + 4096, 4096) == 0);

    /* Metadata. */
    CHECK(moneta_ftruncate(f, 100) == 0 && moneta_fstat(f, &st) == 0 && st.size == 100);
    CHECK(moneta_close(f) == 0);
    CHECK(moneta_mkdir(m, "/exdir", 0755) == 0);
    CHECK(moneta_rename(m, "/example.dat", "/exdir/renamed") == 0);
    CHECK(moneta_stat(m, "/exdir/renamed", &st) == 0 && st.size == 100);
    struct moneta_file *d = moneta_open(m, "/exdir", O_RDONLY | O_DIRECTORY, 0);
    CHECK(d != NULL);
    struct moneta_dirent ents[8];
    uint64_t cookie = 0;
    int found = 0;
    ssize_t got;
    while ((got = moneta_readdir(d, &cookie, ents, 8)) > 0)
        for (ssize_t i = 0; i < got; i++) found += strcmp(ents[i].name, "renamed") == 0;
    CHECK(got == 0 && found == 1);
    CHECK(moneta_close(d) == 0);
    CHECK(moneta_unlink(m, "/exdir/renamed") == 0);
    CHECK(moneta_rmdir(m, "/exdir") == 0);
    struct moneta_statfs sf;
    CHECK(moneta_statfs(m, &sf) == 0 && sf.chunks_free <= sf.chunks);

    moneta_disconnect(m);
    free(data);
    free(back);
    free(bufs);
    puts("moneta_example: ok");
    return 0;
}
