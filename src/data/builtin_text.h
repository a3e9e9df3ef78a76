/* A small generator of plain English sentences, so that the built-in demo
 * trains on real-looking text with no files at all. */
#ifndef MT_DATA_BUILTIN_TEXT_H
#define MT_DATA_BUILTIN_TEXT_H

#include <stddef.h>
#include <stdint.h>

/* About `bytes` bytes of sentences, deterministic in seed; malloc'd,
 * NUL-terminated; *len receives its length. */
char *mt_builtin_text(size_t bytes, uint64_t seed, size_t *len);

#endif
