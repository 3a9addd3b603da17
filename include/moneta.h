/*
 * moneta.h: the C interface of libmoneta, the user-space driver of the Moneta storage system.
 *
 * Errors: a call that returns int, ssize_t or int64_t returns -1 and sets errno; a call that
 * returns a pointer returns NULL and sets errno. Paths are paths inside nvfs, starting with "/" (the moneta_kernel_*
 * calls take paths of the kernel's mount instead).
 * Link with -lmoneta.
 */

#ifndef MONETA_H
#define MONETA_H

/* Generated from crates/libmoneta-c/src/ by cbindgen: do not edit. Regenerate with
 * MONETA_BLESS=1 cargo test -p libmoneta-c --test header. */

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <time.h>

// Requests wait by spinning on the DMA completion.
#define MONETA_COMPLETION_SPIN 0

// Requests wait by forwarding (a completion count and the tag status register).
#define MONETA_COMPLETION_FORWARD 1

// Requests sleep on a futex until the device wakes them.
#define MONETA_COMPLETION_SLEEP 2

// Spin for requests of at most `spin_max` bytes, sleep for larger ones.
#define MONETA_COMPLETION_AUTO 3

// A connection to `monetad` and its channel.
struct moneta_conn;

// An open file.
struct moneta_file;

// A file of the ext4 or XFS file system a daemon started with `--kernel-fs` serves.
struct moneta_kernel_file;

// An asynchronous request.
struct moneta_req;

// File attributes.
struct moneta_stat {
  // Inode number.
  uint64_t ino;
  // Size in bytes.
  uint64_t size;
  // 512-byte blocks allocated.
  uint64_t blocks;
  // Preferred I/O size.
  uint64_t blksize;
  // Last access, seconds.
  int64_t atime_sec;
  // Last modification, seconds.
  int64_t mtime_sec;
  // Last status change, seconds.
  int64_t ctime_sec;
  // Creation, seconds.
  int64_t btime_sec;
  // Nanoseconds of `atime_sec`.
  uint32_t atime_nsec;
  // Nanoseconds of `mtime_sec`.
  uint32_t mtime_nsec;
  // Nanoseconds of `ctime_sec`.
  uint32_t ctime_nsec;
  // Nanoseconds of `btime_sec`.
  uint32_t btime_nsec;
  // Type and permission bits (`S_IF*` | mode).
  uint32_t mode;
  // Links.
  uint32_t nlink;
  // Owner.
  uint32_t uid;
  // Group.
  uint32_t gid;
};

// A directory entry.
struct moneta_dirent {
  // Inode number.
  uint64_t ino;
  // Cookie that continues after this entry.
  uint64_t next;
  // `DT_*` type.
  uint8_t kind;
  // Bytes of `name` before its terminating NUL.
  uint8_t name_len;
  // The name, NUL-terminated.
  char name[256];
};

// File-system totals.
struct moneta_statfs {
  // Allocation unit in bytes.
  uint64_t chunk_size;
  // Chunks in all.
  uint64_t chunks;
  // Free chunks.
  uint64_t chunks_free;
  // Inodes in all.
  uint64_t inodes;
  // Free inodes.
  uint64_t inodes_free;
  // Longest name.
  uint64_t name_max;
};

#ifdef __cplusplus
extern "C" {
#endif // __cplusplus

// Connects to the daemon at `socket` (NULL: `$MONETA_SOCKET` or the default path) and opens
// this process's channel.
struct moneta_conn *moneta_connect(const char *socket);

// Drops the connection; files still open keep it alive until they close.
void moneta_disconnect(struct moneta_conn *m);

// Opens `path` with `open(2)` flags and creation mode.
struct moneta_file *moneta_open(const struct moneta_conn *m,
                                const char *path,
                                int flags,
                                uint32_t mode);

// Closes a file (`EBUSY`, and the file stays open, while requests on it are in flight).
int moneta_close(struct moneta_file *f);

// `read(2)`.
ssize_t moneta_read(const struct moneta_file *f, void *buf, size_t n);

// `write(2)`.
ssize_t moneta_write(const struct moneta_file *f, const void *buf, size_t n);

// `pread(2)`.
ssize_t moneta_pread(const struct moneta_file *f, void *buf, size_t n, int64_t off);

// `pwrite(2)`.
ssize_t moneta_pwrite(const struct moneta_file *f, const void *buf, size_t n, int64_t off);

// `readv(2)`.
ssize_t moneta_readv(const struct moneta_file *f, const struct iovec *iov, int iovcnt);

// `writev(2)`.
ssize_t moneta_writev(const struct moneta_file *f, const struct iovec *iov, int iovcnt);

// `preadv(2)`.
ssize_t moneta_preadv(const struct moneta_file *f,
                      const struct iovec *iov,
                      int iovcnt,
                      int64_t off);

// `pwritev(2)`.
ssize_t moneta_pwritev(const struct moneta_file *f,
                       const struct iovec *iov,
                       int iovcnt,
                       int64_t off);

// `lseek(2)` with `SEEK_SET`, `SEEK_CUR` or `SEEK_END`.
int64_t moneta_lseek(const struct moneta_file *f, int64_t off, int whence);

// `fsync(2)`.
int moneta_fsync(const struct moneta_file *f);

// `fdatasync(2)`.
int moneta_fdatasync(const struct moneta_file *f);

// A barrier on the connection's channel (Moneta §IV): returns 0 once every request submitted
// on it before the call (asynchronous ones included) has completed; the device issues no
// request submitted after the call before then. It orders; `moneta_fsync` persists.
int moneta_barrier(const struct moneta_file *f);

// Advice on the file's bytes `[off, off + len)` (`len` 0: to the end), as `posix_fadvise`
// takes it (`POSIX_FADV_*`): `POSIX_FADV_WILLNEED` sends the device a hint to fill its DRAM
// buffer with them (as `File::will_need` in Rust); the others have nothing to act on (there is no
// page cache) and succeed. Returns 0, or -1 with `errno` (`EINVAL` for an unknown advice or a
// negative range, `EBADF` for `WILLNEED` on a file not open for reading).
int moneta_advise(const struct moneta_file *f, int64_t off, int64_t len, int advice);

// Maps `len` bytes of the file from `off` (a multiple of the page size) into memory, as
// `mmap(2)` with `prot` and `flags` (`MAP_SHARED` or `MAP_PRIVATE`, and any of the others but
// `MAP_ANONYMOUS`): the mapping is of the file's own pages (a memory drive), so a store
// through a shared mapping is at once in the file. A shared writable mapping needs the file
// open for reading and writing (`EACCES`), as the kernel asks of a descriptor. Returns the
// address, or `MAP_FAILED` with `errno` (`ENODEV` where the array hands out no pages: one
// with data checksums). Unmap with `moneta_unmap`; the mapping outlives `moneta_close`.
void *moneta_map(const struct moneta_file *f, size_t len, int prot, int flags, int64_t off);

// Unmaps what `moneta_map` mapped (`munmap(2)`): nothing may use the range afterwards.
int moneta_unmap(void *addr, size_t len);

// `msync(2)` of a range `moneta_map` mapped: with `MS_SYNC`, on a persistent array, the
// stores through it are durable on the host's disk when it returns (docs/nvfs.md).
int moneta_msync(void *addr, size_t len, int flags);

// `ftruncate(2)`.
int moneta_ftruncate(const struct moneta_file *f, int64_t len);

// `fstat(2)`.
int moneta_fstat(const struct moneta_file *f, struct moneta_stat *out);

// `fchmod(2)`.
int moneta_fchmod(const struct moneta_file *f, uint32_t mode);

// Sets how this file's requests wait: one of `MONETA_COMPLETION_*` (`spin_max` matters only
// for `MONETA_COMPLETION_AUTO`); -1 restores the connection's policy.
int moneta_set_completion(const struct moneta_file *f, int mode, size_t spin_max);

// One batch of directory entries of an open directory from `*cookie` (0 to start); advances
// `*cookie`. Returns the entries stored (at most `max`), 0 at the end.
ssize_t moneta_readdir(const struct moneta_file *dir,
                       uint64_t *cookie,
                       struct moneta_dirent *out,
                       size_t max);

// `stat(2)`.
int moneta_stat(const struct moneta_conn *m, const char *path, struct moneta_stat *out);

// `lstat(2)`.
int moneta_lstat(const struct moneta_conn *m, const char *path, struct moneta_stat *out);

// `mkdir(2)`.
int moneta_mkdir(const struct moneta_conn *m, const char *path, uint32_t mode);

// `rmdir(2)`.
int moneta_rmdir(const struct moneta_conn *m, const char *path);

// `unlink(2)`.
int moneta_unlink(const struct moneta_conn *m, const char *path);

// `rename(2)`.
int moneta_rename(const struct moneta_conn *m, const char *from, const char *to);

// `link(2)`.
int moneta_link(const struct moneta_conn *m, const char *from, const char *to);

// `symlink(2)`: a link at `path` pointing to `target`.
int moneta_symlink(const struct moneta_conn *m, const char *target, const char *path);

// `readlink(2)`: the target's bytes (not NUL-terminated, truncated to `size`).
ssize_t moneta_readlink(const struct moneta_conn *m, const char *path, void *buf, size_t size);

// `chmod(2)`.
int moneta_chmod(const struct moneta_conn *m, const char *path, uint32_t mode);

// `chown(2)` (`(uint32_t)-1` leaves an id unchanged).
int moneta_chown(const struct moneta_conn *m, const char *path, uint32_t uid, uint32_t gid);

// `truncate(2)`.
int moneta_truncate(const struct moneta_conn *m, const char *path, int64_t len);

// `utimensat(2)`: `times` NULL sets both to now; `UTIME_NOW` and `UTIME_OMIT` work as there.
int moneta_utimens(const struct moneta_conn *m, const char *path, const struct timespec *times);

// `statfs(2)` of nvfs.
int moneta_statfs(const struct moneta_conn *m, struct moneta_statfs *out);

// Which kernel file system the daemon serves (`monetad --kernel-fs`): 1 for ext4, 2 for
// XFS, 0 when it serves nvfs or a raw array, -1 on error. With `mount` not NULL, the mount
// point's path is written there, NUL-terminated (`ENAMETOOLONG` if `len` bytes cannot hold
// it).
int moneta_kernel_fs(const struct moneta_conn *m, char *mount, size_t len);

// Opens `path`, a regular file of the daemon's kernel file system, through the kernel with
// `open(2)` flags and mode (the kernel checks the caller's rights, creates and truncates), and
// hands it to the daemon: its data then goes through the channel. `O_APPEND`, `O_PATH` and
// `O_DIRECTORY` are `EINVAL`.
struct moneta_kernel_file *moneta_kernel_open(const struct moneta_conn *m,
                                              const char *path,
                                              int flags,
                                              uint32_t mode);

// `pread(2)` on a kernel file.
ssize_t moneta_kernel_pread(const struct moneta_kernel_file *f, void *buf, size_t n, int64_t off);

// `pwrite(2)` on a kernel file (all of it, or -1).
ssize_t moneta_kernel_pwrite(const struct moneta_kernel_file *f,
                             const void *buf,
                             size_t n,
                             int64_t off);

// The size of a kernel file, or -1.
int64_t moneta_kernel_size(const struct moneta_kernel_file *f);

// `ftruncate(2)` on a kernel file, through the kernel.
int moneta_kernel_ftruncate(const struct moneta_kernel_file *f, int64_t len);

// `fsync(2)` on a kernel file: what the channel wrote is made durable.
int moneta_kernel_fsync(const struct moneta_kernel_file *f);

// Closes a kernel file.
int moneta_kernel_close(struct moneta_kernel_file *f);

// Submits a read of `n` bytes at `off` into `buf`, which must stay valid until the request
// is waited for or freed. Returns at once.
struct moneta_req *moneta_submit_read(const struct moneta_file *f,
                                      void *buf,
                                      size_t n,
                                      int64_t off);

// Submits a write of `n` bytes from `buf` at `off` (at the end for a file opened with
// `O_APPEND`); `buf` must stay valid and unchanged until the request ends. Returns at once.
struct moneta_req *moneta_submit_write(const struct moneta_file *f,
                                       const void *buf,
                                       size_t n,
                                       int64_t off);

// Whether the request has ended (1) or not (0), moving it along without blocking.
int moneta_poll(struct moneta_req *r);

// Waits for the request to end and frees it: the bytes moved, or -1 and `errno`.
ssize_t moneta_wait(struct moneta_req *r);

// Frees a request without its result (waiting for the device to be done with it).
void moneta_req_free(struct moneta_req *r);

// Waits until one of the non-NULL requests in `reqs[0..n]` ends; stores its index in
// `*index`, frees it, sets `reqs[*index]` to NULL and returns its result (bytes, or -1 and
// `errno`). With no request left: -1 and `EINVAL`.
ssize_t moneta_wait_any(struct moneta_req **reqs, size_t n, size_t *index);

// Waits for every non-NULL request in `reqs[0..n]`, frees them and sets the slots to NULL;
// `results[i]` (if `results` is not NULL) gets bytes moved or a negative errno. Returns 0.
int moneta_wait_all(struct moneta_req **reqs, size_t n, ssize_t *results);

#ifdef __cplusplus
}  // extern "C"
#endif  // __cplusplus

#endif  /* MONETA_H */
