/* Data files as bytes: a file read whole, decompressed on the way when it
 * is gzip (zlib) or zstd (libzstd), so that every reader of JSONL sees the
 * same bytes whatever the compression.
 *
 * The compression is told by the file's first bytes (gzip 1f 8b, zstd
 * 28 b5 2f fd); a name ending in .gz/.gzip or .zst/.zstd must agree with
 * them. Other compressions (bzip2, xz, lz4, zip, 7z, brotli...) are refused
 * naming the file and how to convert it. Concatenated gzip members and zstd
 * frames are read one after the other, as `zcat` and `zstdcat` do. */
#ifndef MT_DATA_DATA_FILE_H
#define MT_DATA_DATA_FILE_H

#include <stddef.h>

#include "util/error.h"

typedef enum mt_compression { MT_COMPRESS_NONE, MT_COMPRESS_GZIP, MT_COMPRESS_ZSTD } mt_compression;

/* The compression of path (from its first bytes, checked against its
 * name). -1 with a message naming path for an unreadable file, a
 * compression we do not read, or a name that contradicts the bytes. */
int mt_data_file_compression(const char *path, mt_compression *c, mt_error *err);

/* "gzip", "zstd" or "none". */
const char *mt_compression_name(mt_compression c);

/* Reads the whole of path, decompressed, into a malloc'd buffer with a NUL
 * after the last byte (*len excludes it). Corrupt or truncated compressed
 * data is an error naming path, the compressed offset and the library's
 * reason. */
int mt_data_file_read(const char *path, char **buf, size_t *len, mt_error *err);

/* Whether a file name is one a directory of shards is made of: NAME.jsonl
 * or NAME.mtok, optionally followed by .gz or .zst. 0 no; 1 yes; -1 a
 * .jsonl/.mtok name with another compression suffix (.bz2, .xz, ...), an
 * error named in err. */
int mt_data_file_is_shard(const char *name, mt_error *err);

#endif
