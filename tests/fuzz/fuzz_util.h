/* Shared by the libFuzzer harnesses (tests/fuzz/fuzz_*.c): the parsers
 * read files, so each input is written to a file of this process first. */
#ifndef MT_FUZZ_UTIL_H
#define MT_FUZZ_UTIL_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* A per-process directory under /tmp (created once). */
static inline const char *fuzz_dir(void) {
    static char dir[64];
    if (!dir[0]) {
        snprintf(dir, sizeof dir, "/tmp/mt-fuzz-%ld", (long)getpid());
        mkdir(dir, 0700);
    }
    return dir;
}

/* Writes data to fuzz_dir()/name; returns the path (static storage). */
static inline const char *fuzz_file(const char *name, const uint8_t *data, size_t size) {
    static char path[256];
    snprintf(path, sizeof path, "%s/%s", fuzz_dir(), name);
    FILE *f = fopen(path, "wb");
    if (!f) abort();
    if (size && fwrite(data, 1, size, f) != size) abort();
    fclose(f);
    return path;
}

/* The input as a NUL-terminated string (malloc'd). */
static inline char *fuzz_str(const uint8_t *data, size_t size) {
    char *s = malloc(size + 1);
    memcpy(s, data, size);
    s[size] = 0;
    return s;
}

#endif
