/*
 * probe.c: the C library calls a program makes on Moneta files, checked one by one under the
 * LD_PRELOAD shim (run by tests/shim.rs through `moneta run`). Prints "probe: ok" at the end;
 * any failed check prints where and exits 1. The directory argument is a Moneta directory.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#define CHECK(c)                                                                            \
    do {                                                                                    \
        if (!(c)) {                                                                         \
            fprintf(stderr, "probe: %s:%d: %s (errno %d: %s)\n", __FILE__, __LINE__, #c, errno, \
                    strerror(errno));                                                       \
            exit(1);                                                                        \
        }                                                                                   \
    } while (0)

/* dir/name in one of four rotating buffers (a call may take two paths). */
static const char *P(const char *dir, const char *name) {
    static char paths[4][512];
    static int next;
    char *p = paths[next++ % 4];
    snprintf(p, 512, "%s/%s", dir, name);
    return p;
}

static void child_exit_status(pid_t pid, int want) {
    int st;
    CHECK(waitpid(pid, &st, 0) == pid);
    CHECK(WIFEXITED(st));
    if (WEXITSTATUS(st) != want) fprintf(stderr, "probe: child exit %d, want %d\n", WEXITSTATUS(st), want);
    CHECK(WEXITSTATUS(st) == want);
}

int main(int argc, char **argv) {
    CHECK(argc == 2);
    const char *d = argv[1];
    char buf[256];
    CHECK(mkdir(d, 0755) == 0);

    /* errno is left alone on success, set on failure. */
    errno = 1234;
    int fd = open(P(d, "p1"), O_CREAT | O_RDWR | O_TRUNC | O_CLOEXEC, 0640);
    CHECK(fd >= 3 && errno == 1234);
    CHECK(write(fd, "abcdef", 6) == 6 && errno == 1234);
    CHECK(lseek(fd, 0, SEEK_SET) == 0);
    CHECK(read(fd, buf, 3) == 3 && memcmp(buf, "abc", 3) == 0);
    errno = 0;
    CHECK(open(P(d, "missing"), O_RDONLY) == -1 && errno == ENOENT);
    CHECK(open(P(d, "p1"), O_CREAT | O_EXCL | O_RDWR, 0600) == -1 && errno == EEXIST);
    CHECK(read(fd, NULL, 0) == 0);

    /* Descriptors: dup shares the position; close of one alias leaves the others. */
    int fd2 = dup(fd);
    CHECK(fd2 > fd);
    CHECK(read(fd2, buf, 3) == 3 && memcmp(buf, "def", 3) == 0);
    CHECK(dup2(fd, 50) == 50);
    CHECK(lseek(50, 1, SEEK_SET) == 1 && lseek(fd2, 0, SEEK_CUR) == 1);
    CHECK(close(fd) == 0);
    CHECK(pread(fd2, buf, 2, 4) == 2 && memcmp(buf, "ef", 2) == 0);
    CHECK(fcntl(50, F_GETFD) == 0);                  /* dup2 clears close-on-exec */
    CHECK((fcntl(fd2, F_GETFL) & O_ACCMODE) == O_RDWR);
    CHECK(fcntl(fd2, F_SETFL, O_APPEND) == 0 && (fcntl(fd2, F_GETFL) & O_APPEND));
    CHECK(write(fd2, "XY", 2) == 2);                 /* appended */
    CHECK(pread(50, buf, 8, 0) == 8 && memcmp(buf, "abcdefXY", 8) == 0);
    CHECK(fcntl(fd2, F_SETFL, 0) == 0);
    int fd3 = fcntl(fd2, F_DUPFD_CLOEXEC, 100);
    CHECK(fd3 >= 100 && fcntl(fd3, F_GETFD) == FD_CLOEXEC);
    CHECK(close(fd3) == 0 && close(50) == 0);

    /* Attributes. */
    struct stat st;
    CHECK(fstat(fd2, &st) == 0 && st.st_size == 8 && S_ISREG(st.st_mode));
    CHECK((st.st_mode & 0777) == (0640 & ~(mode_t)022) || (st.st_mode & 0777) == 0640);
    CHECK(stat(P(d, "p1"), &st) == 0 && st.st_size == 8);
    CHECK(access(P(d, "p1"), R_OK | W_OK) == 0);
    errno = 0;
    CHECK(access(P(d, "nope"), F_OK) == -1 && errno == ENOENT);
    struct statx sx;
    CHECK(statx(AT_FDCWD, P(d, "p1"), 0, STATX_BASIC_STATS, &sx) == 0 && sx.stx_size == 8);

    /* Vectored and positioned I/O, truncate, sync. */
    struct iovec v[2] = {{"12", 2}, {"345", 3}};
    CHECK(pwritev(fd2, v, 2, 10) == 5);
    char a[2], b[3];
    struct iovec r[2] = {{a, 2}, {b, 3}};
    CHECK(preadv(fd2, r, 2, 10) == 5 && memcmp(a, "12", 2) == 0 && memcmp(b, "345", 3) == 0);
    CHECK(pread(fd2, buf, 2, 8) == 2 && buf[0] == 0 && buf[1] == 0); /* the hole */
    CHECK(ftruncate(fd2, 4) == 0 && fstat(fd2, &st) == 0 && st.st_size == 4);
    CHECK(fsync(fd2) == 0 && fdatasync(fd2) == 0);
    /* A shared mapping is the file's own pages: a store is the file's byte at once, and a
       write of the file is in the mapping at once. */
    char cur[4];
    CHECK(pread(fd2, cur, 4, 0) == 4);
    char *s = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd2, 0);
    CHECK(s != MAP_FAILED && memcmp(s, cur, 4) == 0 && s[4] == 0 && s[4095] == 0);
    s[1] = 'S';
    CHECK(pread(fd2, buf, 1, 1) == 1 && buf[0] == 'S');
    CHECK(pwrite(fd2, "W", 1, 2) == 1 && s[2] == 'W');
    CHECK(msync(s, 4096, MS_SYNC) == 0 && munmap(s, 4096) == 0);
    CHECK(pread(fd2, buf, 4, 0) == 4 && buf[1] == 'S' && buf[2] == 'W');
    CHECK(pwrite(fd2, cur, 4, 0) == 4); /* as it was */
    /* A private mapping: the file's bytes, zeros past its end, stores of its own. */
    char *m = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd2, 0);
    CHECK(m != MAP_FAILED && memcmp(m, cur, 4) == 0 && m[4] == 0 && m[4095] == 0);
    m[0] = 'Q';
    CHECK(pread(fd2, buf, 1, 0) == 1 && buf[0] == cur[0] && munmap(m, 4096) == 0);
    m = mmap(NULL, 4096, PROT_READ, MAP_PRIVATE, fd2, 0);
    CHECK(m != MAP_FAILED && memcmp(m, cur, 4) == 0 && munmap(m, 4096) == 0);
    errno = 0;
    CHECK(mmap(NULL, 4096, PROT_READ, MAP_PRIVATE, fd2, 100) == MAP_FAILED && errno == EINVAL);

    /* A forked child shares the position and writes through its own channel. */
    CHECK(lseek(fd2, 0, SEEK_SET) == 0);
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        char c[2];
        if (read(fd2, c, 2) != 2 || memcmp(c, "ab", 2) != 0) _exit(2);
        if (write(fd2, "ZZ", 2) != 2) _exit(3);
        _exit(0);
    }
    child_exit_status(pid, 0);
    CHECK(lseek(fd2, 0, SEEK_CUR) == 4);
    CHECK(pread(fd2, buf, 4, 0) == 4 && memcmp(buf, "abZZ", 4) == 0);

    /* exec: a descriptor without close-on-exec stays usable in the new program. */
    int out = open(P(d, "exec-out"), O_CREAT | O_WRONLY | O_TRUNC, 0644);
    CHECK(out >= 0);
    pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        if (dup2(out, 1) != 1) _exit(4);
        execlp("cat", "cat", P(d, "p1"), (char *)NULL);
        _exit(5);
    }
    child_exit_status(pid, 0);
    CHECK(close(out) == 0);
    int in = open(P(d, "exec-out"), O_RDONLY);
    CHECK(in >= 0 && read(in, buf, 10) == 4 && memcmp(buf, "abZZ", 4) == 0);
    CHECK(close(in) == 0);

    /* Record locks between processes. */
    struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = 0, .l_len = 10};
    CHECK(fcntl(fd2, F_SETLK, &fl) == 0);
    pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        int f = open(P(d, "p1"), O_RDWR);
        struct flock t = {.l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = 5, .l_len = 1};
        if (fcntl(f, F_SETLK, &t) != -1 || (errno != EAGAIN && errno != EACCES)) _exit(6);
        if (fcntl(f, F_GETLK, &t) != 0 || t.l_type != F_WRLCK || t.l_pid != getppid()) _exit(7);
        t.l_type = F_RDLCK;
        t.l_start = 20;
        if (fcntl(f, F_SETLK, &t) != 0) _exit(8);
        if (flock(f, LOCK_EX | LOCK_NB) != 0) _exit(9);
        _exit(0);
    }
    child_exit_status(pid, 0);
    fl.l_type = F_UNLCK;
    CHECK(fcntl(fd2, F_SETLK, &fl) == 0);

    /* stdio streams. */
    FILE *f = fopen(P(d, "stdio.txt"), "w+");
    CHECK(f != NULL);
    CHECK(fprintf(f, "line %d\n", 42) > 0);
    CHECK(fflush(f) == 0 && fseek(f, 0, SEEK_SET) == 0);
    CHECK(fgets(buf, sizeof buf, f) != NULL && strcmp(buf, "line 42\n") == 0);
    CHECK(fstat(fileno(f), &st) == 0 && st.st_size == 8);
    CHECK(fclose(f) == 0);

    /* freopen of stdout onto a Moneta file (in a child: this process keeps its stdout); the
       final flush at exit goes through the shim. */
    pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        if (freopen(P(d, "freopened"), "w", stdout) == NULL) _exit(10);
        printf("to the file %d\n", 7);
        exit(0);
    }
    child_exit_status(pid, 0);
    f = fopen(P(d, "freopened"), "r");
    CHECK(f != NULL && fgets(buf, sizeof buf, f) != NULL && strcmp(buf, "to the file 7\n") == 0);
    CHECK(fclose(f) == 0);

    /* Directories, names, the current directory. */
    CHECK(mkdir(P(d, "sub"), 0755) == 0);
    CHECK(rename(P(d, "stdio.txt"), P(d, "sub/moved")) == 0);
    errno = 0;
    CHECK(rename(P(d, "sub/moved"), "/tmp/moneta-probe-xdev") == -1 && errno == EXDEV);
    DIR *dir = opendir(P(d, "sub"));
    CHECK(dir != NULL);
    int found = 0;
    struct dirent *e;
    while ((e = readdir(dir)) != NULL) found += strcmp(e->d_name, "moved") == 0;
    CHECK(found == 1 && closedir(dir) == 0);
    char here[512];
    CHECK(chdir(P(d, "sub")) == 0 && getcwd(here, sizeof here) != NULL);
    CHECK(strcmp(here, P(d, "sub")) == 0);
    CHECK(access("moved", F_OK) == 0);
    CHECK(chdir("/") == 0);

    /* An unlinked file stays readable through its descriptor. */
    CHECK(unlink(P(d, "p1")) == 0);
    CHECK(pread(fd2, buf, 4, 0) == 4 && memcmp(buf, "abZZ", 4) == 0);
    CHECK(close(fd2) == 0);
    errno = 0;
    CHECK(close(fd2) == -1 && errno == EBADF);

    puts("probe: ok");
    return 0;
}
