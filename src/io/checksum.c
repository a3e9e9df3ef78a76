/* XXH3-64 of a file, read in 4 MiB blocks. */
#include "io/checksum.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <xxhash.h>

#include "util/mem.h"

#define BLOCK ((size_t)4 << 20)

int mt_file_xxh3(const char *path, uint64_t *hash, int64_t *bytes, mt_error *err) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return mt_errorf(err, "%s: cannot open: %s", path, strerror(errno));
    XXH3_state_t *st = XXH3_createState();
    MT_ASSERT(st);
    XXH3_64bits_reset(st);
    char *buf = mt_malloc_or_die(BLOCK);
    int64_t total = 0;
    int rc = 0;
    for (;;) {
        ssize_t n = read(fd, buf, BLOCK);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) {
            rc = mt_errorf(err, "%s: read error: %s", path, strerror(errno));
            break;
        }
        if (n == 0) break;
        XXH3_64bits_update(st, buf, (size_t)n);
        total += n;
    }
    if (rc == 0) {
        *hash = XXH3_64bits_digest(st);
        if (bytes) *bytes = total;
    }
    XXH3_freeState(st);
    free(buf);
    close(fd);
    return rc;
}

void mt_xxh3_hex(uint64_t h, char buf[17]) {
    snprintf(buf, 17, "%016llx", (unsigned long long)h);
}
