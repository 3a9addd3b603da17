/* A read-only mapping of a Moneta file, written: no writable pages are to be had (mmap and
   mprotect refuse with EACCES), and the store itself dies of SIGSEGV. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <sys/mman.h>
#include <unistd.h>

int main(int argc, char **argv) {
    if (argc != 2) return 2;
    int fd = open(argv[1], O_RDONLY);
    if (fd < 0) return 3;
    char *m = mmap(NULL, 4096, PROT_READ, MAP_SHARED, fd, 0);
    if (m == MAP_FAILED) return 4;
    if (mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0) != MAP_FAILED || errno != EACCES)
        return 5;
    if (mprotect(m, 4096, PROT_READ | PROT_WRITE) == 0 || errno != EACCES) return 6;
    printf("%.8s\n", m);
    fflush(stdout);
    *(volatile char *)m = 'X';
    return 7;
}
