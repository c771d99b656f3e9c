/* Shared by the libFuzzer targets: the readers under test take a path, so each input is written
 * to an anonymous in-memory file (memfd) and handed over as /proc/self/fd/N. */
#ifndef DT_FUZZ_COMMON_H
#define DT_FUZZ_COMMON_H

#include <stdint.h>
#include <stdio.h>
#include <sys/mman.h>
#include <unistd.h>

/* Writes data to a fresh memfd; path gets its /proc name. Returns the fd (close it), or -1. */
static inline int dt_fuzz_file(const uint8_t *data, size_t size, char *path, size_t cap) {
    int fd = memfd_create("dtrain-fuzz", MFD_CLOEXEC);
    if (fd < 0) return -1;
    size_t done = 0;
    while (done < size) {
        ssize_t w = write(fd, data + done, size - done);
        if (w <= 0) {
            close(fd);
            return -1;
        }
        done += (size_t)w;
    }
    snprintf(path, cap, "/proc/self/fd/%d", fd);
    return fd;
}

#endif
