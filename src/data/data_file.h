/* Data files as bytes, decompressed on the way when they are gzip (zlib) or
 * zstd (libzstd), so that every reader of JSONL sees the same bytes whatever
 * the compression: read whole (a compressed .mtok), or streamed a block of
 * whole lines at a time with a bound on the length of a line (JSONL), so
 * that a small file that expands to gigabytes never sits whole in memory.
 *
 * The compression is told by the file's first bytes (gzip 1f 8b, zstd
 * 28 b5 2f fd); a name ending in .gz/.gzip or .zst/.zstd must agree with
 * them. Other compressions (bzip2, xz, lz4, zip, 7z, brotli...) are refused
 * naming the file and how to convert it. Concatenated gzip members and zstd
 * frames are read one after the other, as `zcat` and `zstdcat` do. */
#ifndef MT_DATA_DATA_FILE_H
#define MT_DATA_DATA_FILE_H

#include <stddef.h>
#include <stdint.h>

#include "util/error.h"

/* The longest JSONL line (one document) megatrain reads: 256 MiB. */
#define MT_DATA_MAX_LINE ((size_t)256 << 20)

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

/* The first n bytes of path once decompressed into buf (*got fewer when
 * the file is shorter). */
int mt_data_file_head(const char *path, void *buf, size_t n, size_t *got, mt_error *err);

/* The bytes of path once decompressed, counted by streaming through it
 * (nothing is kept), stopping as soon as they exceed `cap`: *size is then
 * more than cap (a lower bound). A plain file's size is its length. */
int mt_data_file_size(const char *path, uint64_t cap, uint64_t *size, mt_error *err);

/* A data file read as lines. */
typedef struct mt_line_reader mt_line_reader;

/* Opens path (plain, gzip or zstd); no line may be longer than max_line
 * bytes. NULL with err naming path on failure. */
mt_line_reader *mt_line_reader_open(const char *path, size_t max_line, mt_error *err);

/* The same over len bytes of memory (not copied: buf must outlive the
 * reader); name is what messages call it. */
mt_line_reader *mt_line_reader_open_memory(const char *name, const char *buf, size_t len,
                                           size_t max_line, mt_error *err);

/* The next whole lines, about `want` bytes of them (more only when one line
 * is longer), in *lines (len bytes, valid until the next call): every line
 * ends with '\n' except the file's last. 0 with lines; 1 at the end of the
 * file; -1 with err naming the file and line: a line longer than max_line,
 * corrupt or truncated compressed data, a read error. */
int mt_line_reader_next(mt_line_reader *r, size_t want, const char **lines, size_t *len,
                        mt_error *err);

/* Lines handed out so far, and their bytes (decompressed). */
uint64_t mt_line_reader_lines(const mt_line_reader *r);
uint64_t mt_line_reader_bytes(const mt_line_reader *r);

void mt_line_reader_close(mt_line_reader *r);

/* Whether a file name is one a directory of shards is made of: NAME.jsonl
 * or NAME.mtok, optionally followed by .gz or .zst. 0 no; 1 yes; -1 a
 * .jsonl/.mtok name with another compression suffix (.bz2, .xz, ...), an
 * error named in err. */
int mt_data_file_is_shard(const char *name, mt_error *err);

#endif
