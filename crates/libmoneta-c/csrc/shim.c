/*
 * The variadic entry points of the LD_PRELOAD shim, and the stdio glue.
 *
 * C variadic functions cannot be defined in stable Rust, so open(2), fcntl(2), ioctl(2) and
 * execl(3) live here: each reads its optional argument the way the C library does and calls
 * the Rust side (moneta_shim_*), which decides whether the call is about a Moneta file.
 * open's mode is read only when O_CREAT or O_TMPFILE asks for one, as the C library does.
 *
 * Moneta descriptors get stdio streams through fopencookie(3), whose functions call the
 * shim's read/write/lseek/close; fileno(3) of such a stream answers the descriptor.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/ioctl.h>
#include <sys/types.h>
#include <unistd.h>

int moneta_shim_openat(int dirfd, const char *path, int flags, mode_t mode);
int moneta_shim_fcntl(int fd, int cmd, uintptr_t arg);
int moneta_shim_ioctl(int fd, unsigned long req, uintptr_t arg);

static int wants_mode(int flags) {
    return (flags & O_CREAT) != 0 || (flags & O_TMPFILE) == O_TMPFILE;
}

#define READ_MODE(last)                        \
    mode_t mode = 0;                           \
    if (wants_mode(flags)) {                   \
        va_list ap;                            \
        va_start(ap, last);                    \
        mode = (mode_t)va_arg(ap, unsigned);   \
        va_end(ap);                            \
    }

int open(const char *path, int flags, ...) {
    READ_MODE(flags);
    return moneta_shim_openat(AT_FDCWD, path, flags, mode);
}

int open64(const char *path, int flags, ...) {
    READ_MODE(flags);
    return moneta_shim_openat(AT_FDCWD, path, flags | O_LARGEFILE, mode);
}

int openat(int dirfd, const char *path, int flags, ...) {
    READ_MODE(flags);
    return moneta_shim_openat(dirfd, path, flags, mode);
}

int openat64(int dirfd, const char *path, int flags, ...) {
    READ_MODE(flags);
    return moneta_shim_openat(dirfd, path, flags | O_LARGEFILE, mode);
}

/* The _FORTIFY_SOURCE variants: called without a mode (they abort on O_CREAT without one). */
int __open_2(const char *path, int flags) {
    if (wants_mode(flags)) abort();
    return moneta_shim_openat(AT_FDCWD, path, flags, 0);
}

int __open64_2(const char *path, int flags) {
    if (wants_mode(flags)) abort();
    return moneta_shim_openat(AT_FDCWD, path, flags | O_LARGEFILE, 0);
}

int __openat_2(int dirfd, const char *path, int flags) {
    if (wants_mode(flags)) abort();
    return moneta_shim_openat(dirfd, path, flags, 0);
}

int __openat64_2(int dirfd, const char *path, int flags) {
    if (wants_mode(flags)) abort();
    return moneta_shim_openat(dirfd, path, flags | O_LARGEFILE, 0);
}

/* fcntl's third argument is an int or a pointer; either fits a uintptr_t on this ABI. */
int fcntl(int fd, int cmd, ...) {
    va_list ap;
    va_start(ap, cmd);
    uintptr_t arg = va_arg(ap, uintptr_t);
    va_end(ap);
    return moneta_shim_fcntl(fd, cmd, arg);
}

int fcntl64(int fd, int cmd, ...) {
    va_list ap;
    va_start(ap, cmd);
    uintptr_t arg = va_arg(ap, uintptr_t);
    va_end(ap);
    return moneta_shim_fcntl(fd, cmd, arg);
}

int ioctl(int fd, unsigned long req, ...) {
    va_list ap;
    va_start(ap, req);
    uintptr_t arg = va_arg(ap, uintptr_t);
    va_end(ap);
    return moneta_shim_ioctl(fd, req, arg);
}

/* execl and friends: collect the arguments and call the execv family (hooked in Rust). */
#define COLLECT_ARGS(argv, first)                                  \
    size_t n = 1;                                                  \
    va_list ap;                                                    \
    va_start(ap, first);                                           \
    while (va_arg(ap, const char *) != NULL) n++;                  \
    va_end(ap);                                                    \
    char **argv = malloc((n + 1) * sizeof(char *));                \
    if (argv == NULL) { errno = ENOMEM; return -1; }               \
    argv[0] = (char *)first;                                       \
    va_start(ap, first);                                           \
    for (size_t i = 1; i <= n; i++) argv[i] = va_arg(ap, char *);  \

int execl(const char *path, const char *arg, ...) {
    COLLECT_ARGS(argv, arg)
    va_end(ap);
    int r = execv(path, argv);
    int e = errno;
    free(argv);
    errno = e;
    return r;
}

int execlp(const char *file, const char *arg, ...) {
    COLLECT_ARGS(argv, arg)
    va_end(ap);
    int r = execvp(file, argv);
    int e = errno;
    free(argv);
    errno = e;
    return r;
}

int execle(const char *path, const char *arg, ...) {
    COLLECT_ARGS(argv, arg)
    char *const *envp = va_arg(ap, char *const *);
    va_end(ap);
    int r = execve(path, argv, envp);
    int e = errno;
    free(argv);
    errno = e;
    return r;
}

/* stdio streams over Moneta descriptors. */
static ssize_t cookie_read(void *c, char *buf, size_t n) {
    return read((int)(intptr_t)c, buf, n);
}

static ssize_t cookie_write(void *c, const char *buf, size_t n) {
    ssize_t r = write((int)(intptr_t)c, buf, n);
    /* A cookie write reports failure as 0 bytes (never negative); errno says why. */
    return r < 0 ? 0 : r;
}

static int cookie_seek(void *c, off64_t *off, int whence) {
    off64_t r = lseek64((int)(intptr_t)c, *off, whence);
    if (r < 0) return -1;
    *off = r;
    return 0;
}

static int cookie_close(void *c) {
    return close((int)(intptr_t)c);
}

FILE *moneta_shim_cookie_stream(int fd, const char *mode) {
    cookie_io_functions_t io = {cookie_read, cookie_write, cookie_seek, cookie_close};
    FILE *fp = fopencookie((void *)(intptr_t)fd, mode, io);
    if (fp != NULL) fp->_fileno = fd;
    return fp;
}

/*
 * The standard streams. stdin, stdout and stderr read and write descriptors 0, 1 and 2 from
 * inside the C library, so while one of those descriptors is a Moneta file (after a shell's
 * redirection, or handed over across exec), the stream variable points at a cookie stream on
 * that descriptor instead, and back at the C library's stream when the descriptor stops being
 * a Moneta file. A program that kept its own copy of the pointer keeps the C library's stream.
 */
static FILE *std_orig[3];
static FILE *std_cookie[3];

static int std_close_nothing(void *c) {
    (void)c;
    return 0;
}

static FILE **std_slot(int fd) {
    return fd == 0 ? &stdin : fd == 1 ? &stdout : &stderr;
}

/* Before descriptor fd (0, 1 or 2) changes: what its stream holds goes where it points now. */
void moneta_shim_std_before(int fd) {
    if (fd < 0 || fd > 2) return;
    FILE *s = *std_slot(fd);
    if (s != NULL && fd != 0) fflush(s);
}

/* After descriptor fd (0, 1 or 2) changed: a cookie stream while it is a Moneta file. */
void moneta_shim_std_after(int fd, int is_moneta) {
    if (fd < 0 || fd > 2) return;
    FILE **slot = std_slot(fd);
    if (is_moneta) {
        if (std_cookie[fd] != NULL) return; /* it follows the descriptor number */
        cookie_io_functions_t io = {cookie_read, cookie_write, cookie_seek, std_close_nothing};
        FILE *c = fopencookie((void *)(intptr_t)fd, fd == 0 ? "r" : "w", io);
        if (c == NULL) return;
        c->_fileno = fd;
        if (fd == 2) setvbuf(c, NULL, _IONBF, 0);
        if (std_orig[fd] == NULL) std_orig[fd] = *slot;
        std_cookie[fd] = c;
        *slot = c;
    } else if (std_cookie[fd] != NULL) {
        FILE *c = std_cookie[fd];
        std_cookie[fd] = NULL;
        *slot = std_orig[fd];
        fclose(c); /* flushed already; closes nothing */
    }
}

/* The stream the variable of descriptor fd (0, 1 or 2) points at now. */
FILE *moneta_shim_std_stream(int fd) {
    if (fd < 0 || fd > 2) return NULL;
    return *std_slot(fd);
}
