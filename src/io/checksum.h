/* File checksums for checkpoints: XXH3 64-bit (libxxhash), fast enough to
 * hash a checkpoint at disk speed (tens of GB/s per core from the page
 * cache). It detects corruption (a flipped bit, a torn or zeroed block),
 * not tampering: it is not a cryptographic hash. */
#ifndef MT_IO_CHECKSUM_H
#define MT_IO_CHECKSUM_H

#include <stddef.h>
#include <stdint.h>

#include "util/error.h"

/* XXH3-64 of the whole file at path into *hash; its size into *bytes (may
 * be NULL). -1 with a message naming path when it cannot be read. */
int mt_file_xxh3(const char *path, uint64_t *hash, int64_t *bytes, mt_error *err);

/* The 16 lowercase hex digits of h, NUL-terminated, into buf[17]. */
void mt_xxh3_hex(uint64_t h, char buf[17]);

#endif
