/* Data files read whole, counted or a block of lines at a time, with gzip
 * (zlib) and zstd (libzstd) decompression streamed from the file in chunks;
 * see data_file.h. */
#include "data/data_file.h"

#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <zlib.h>
#include <zstd.h>

#include "io/file.h"
#include "util/mem.h"

#define CHUNK ((size_t)1 << 20)

/* Compressions we recognise but do not read: the first bytes, the usual
 * suffix, and the command that turns the file into one we read. */
static const struct other {
    const char *name, *magic;
    size_t magic_len;
    const char *suffix, *fix;
} others[] = {
    {"bzip2", "BZh", 3, ".bz2", "bunzip2 -k FILE"},
    {"xz", "\xfd" "7zXZ\0", 6, ".xz", "unxz -k FILE"},
    {"lzma", NULL, 0, ".lzma", "unlzma -k FILE"},
    {"lz4", "\x04\x22\x4d\x18", 4, ".lz4", "lz4 -d FILE"},
    {"lzip", "LZIP", 4, ".lz", "lzip -dk FILE"},
    {"zip", "PK\x03\x04", 4, ".zip", "unzip FILE"},
    {"7z", "7z\xbc\xaf\x27\x1c", 6, ".7z", "7z x FILE"},
    {"compress (.Z)", "\x1f\x9d", 2, ".Z", "uncompress FILE"},
    {"brotli", NULL, 0, ".br", "brotli -d FILE"},
    {"snappy", "\xff\x06\x00\x00sNaPpY", 10, ".sz", "decompress it"},
};

static bool ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && !strcmp(s + n - k, suffix);
}

const char *mt_compression_name(mt_compression c) {
    return c == MT_COMPRESS_GZIP ? "gzip" : c == MT_COMPRESS_ZSTD ? "zstd" : "none";
}

static int unsupported(const char *path, const struct other *o, mt_error *err) {
    return mt_errorf(err, "%s: %s-compressed data, which megatrain does not read: decompress it "
                     "(%s) or recompress it with gzip (.gz) or zstd (.zst)", path, o->name,
                     o->fix);
}

int mt_data_file_compression(const char *path, mt_compression *c, mt_error *err) {
    unsigned char head[16] = {0};
    FILE *f = fopen(path, "rb");
    if (!f) return mt_errorf(err, "%s: cannot open: %s", path, strerror(errno));
    size_t n = fread(head, 1, sizeof head, f);
    fclose(f);
    *c = n >= 2 && head[0] == 0x1f && head[1] == 0x8b ? MT_COMPRESS_GZIP
         : n >= 4 && !memcmp(head, "\x28\xb5\x2f\xfd", 4) ? MT_COMPRESS_ZSTD
                                                           : MT_COMPRESS_NONE;
    for (size_t i = 0; i < sizeof others / sizeof *others; i++) {
        const struct other *o = &others[i];
        if ((o->magic && n >= o->magic_len && !memcmp(head, o->magic, o->magic_len)) ||
            ends_with(path, o->suffix))
            return unsupported(path, o, err);
    }
    bool says_gz = ends_with(path, ".gz") || ends_with(path, ".gzip");
    bool says_zst = ends_with(path, ".zst") || ends_with(path, ".zstd");
    if ((says_gz && *c != MT_COMPRESS_GZIP) || (says_zst && *c != MT_COMPRESS_ZSTD))
        return mt_errorf(err, "%s: the name says %s but the file %s: rename it, or re-create it "
                         "with %s", path, says_gz ? "gzip" : "zstd",
                         n == 0 ? "is empty"
                         : *c == MT_COMPRESS_NONE ? "does not start like one (not compressed?)"
                                                  : "holds the other compression",
                         says_gz ? "gzip" : "zstd");
    return 0;
}

/* ---- a decompressing stream ---- */

/* A file read from the start, decompressed: the state of zlib or libzstd
 * between reads, so that a caller takes the output in pieces of its size. */
typedef struct stream {
    const char *path;
    FILE *f;
    mt_compression c;
    unsigned char *in;   // (CHUNK) compressed input; NULL for a plain file
    uint64_t consumed;   // compressed bytes before in[0]
    bool eof;            // the output is complete
    bool full;           // the last call filled its room: output may be pending
    bool in_member;      // gzip: inside a member
    int zr;              // gzip: the last inflate() result
    size_t zsr;          // zstd: the last ZSTD_decompressStream() result (0: a frame ended)
    z_stream z;
    ZSTD_DCtx *zs;
    ZSTD_inBuffer ib;
} stream;

static int stream_open(stream *s, const char *path, mt_error *err) {
    memset(s, 0, sizeof *s);
    s->path = path;
    if (mt_data_file_compression(path, &s->c, err)) return -1;
    s->f = fopen(path, "rb");
    if (!s->f) return mt_errorf(err, "%s: cannot open: %s", path, strerror(errno));
    s->zr = Z_OK;
    if (s->c == MT_COMPRESS_NONE) return 0;
    s->in = mt_malloc_or_die(CHUNK);
    if (s->c == MT_COMPRESS_GZIP) {
        MT_ASSERT(inflateInit2(&s->z, 15 + 16) == Z_OK);
    } else {
        s->zs = ZSTD_createDCtx();
        MT_ASSERT(s->zs);
        s->ib = (ZSTD_inBuffer){s->in, 0, 0};
    }
    return 0;
}

static void stream_close(stream *s) {
    if (s->c == MT_COMPRESS_GZIP && s->in) inflateEnd(&s->z);
    if (s->zs) ZSTD_freeDCtx(s->zs);
    free(s->in);
    if (s->f) fclose(s->f);
    memset(s, 0, sizeof *s);
}

static int read_error(const stream *s, mt_error *err) {
    return mt_errorf(err, "%s: read error: %s", s->path, strerror(errno));
}

static int truncated(const stream *s, mt_error *err) {
    return mt_errorf(err, "%s: the %s data ends early after %llu compressed bytes (truncated "
                     "file): re-create or re-download it", s->path, mt_compression_name(s->c),
                     (unsigned long long)s->consumed);
}

/* Fills in[] when it is used up and no output is pending; false at the end
 * of the file (s->eof set) or on a read error (-1 in *rc). */
static bool refill(stream *s, size_t *avail, int *rc, mt_error *err) {
    size_t got = fread(s->in, 1, CHUNK, s->f);
    if (got == 0 && ferror(s->f)) {
        *rc = read_error(s, err);
        return false;
    }
    if (got == 0) s->eof = true;
    *avail = got;
    return got > 0;
}

/* gzip: one member after another until the input ends; zlib checks each
 * member's CRC-32 and length. */
static int inflate_some(stream *s, char *dst, size_t room, size_t *done, mt_error *err) {
    z_stream *z = &s->z;
    int rc = 0;
    while (*done < room && !s->eof) {
        if (z->avail_in == 0 && !s->full) {
            s->consumed += (uint64_t)(z->next_in ? z->next_in - s->in : 0);
            z->next_in = s->in;
            size_t got;
            if (!refill(s, &got, &rc, err)) {
                if (rc) return rc;
                return s->in_member ? truncated(s, err) : 0;
            }
            z->avail_in = (uInt)got;
        }
        if (!s->in_member && s->zr == Z_STREAM_END) inflateReset(z);
        size_t want = room - *done > ((size_t)1 << 30) ? (size_t)1 << 30 : room - *done;
        z->next_out = (Bytef *)dst + *done;
        z->avail_out = (uInt)want;
        s->zr = inflate(z, Z_NO_FLUSH);
        *done += want - z->avail_out;
        s->full = z->avail_out == 0 && s->zr != Z_STREAM_END;
        s->in_member = s->zr == Z_OK || s->zr == Z_BUF_ERROR;
        if (s->zr != Z_OK && s->zr != Z_STREAM_END && s->zr != Z_BUF_ERROR)
            return mt_errorf(err, "%s: corrupt gzip data near compressed byte %llu (zlib: %s): "
                             "the file is damaged; re-create or re-download it", s->path,
                             (unsigned long long)(s->consumed + (uint64_t)(z->next_in - s->in)),
                             z->msg ? z->msg : zError(s->zr));
    }
    return 0;
}

/* zstd: frames one after the other; a frame's checksum, when it has one,
 * is checked by libzstd. */
static int unzstd_some(stream *s, char *dst, size_t room, size_t *done, mt_error *err) {
    int rc = 0;
    while (*done < room && !s->eof) {
        if (s->ib.pos == s->ib.size && !s->full) {
            s->consumed += s->ib.size;
            size_t got;
            if (!refill(s, &got, &rc, err)) {
                if (rc) return rc;
                /* zsr is 0 only where a frame ended; anything else is a cut frame */
                return s->zsr != 0 ? truncated(s, err) : 0;
            }
            s->ib.size = got, s->ib.pos = 0;
        }
        ZSTD_outBuffer ob = {dst + *done, room - *done, 0};
        s->zsr = ZSTD_decompressStream(s->zs, &ob, &s->ib);
        if (ZSTD_isError(s->zsr))
            return mt_errorf(err, "%s: corrupt zstd data near compressed byte %llu (zstd: %s): "
                             "the file is damaged; re-create or re-download it", s->path,
                             (unsigned long long)(s->consumed + s->ib.pos),
                             ZSTD_getErrorName(s->zsr));
        *done += ob.pos;
        s->full = ob.pos == ob.size && s->zsr != 0;
    }
    return 0;
}

/* Up to room bytes of output into dst; *got is less than room only at the
 * end of the file. */
static int stream_read(stream *s, char *dst, size_t room, size_t *got, mt_error *err) {
    *got = 0;
    if (s->eof || room == 0) return 0;
    if (s->c == MT_COMPRESS_GZIP) return inflate_some(s, dst, room, got, err);
    if (s->c == MT_COMPRESS_ZSTD) return unzstd_some(s, dst, room, got, err);
    while (*got < room && !s->eof) {
        size_t n = fread(dst + *got, 1, room - *got, s->f);
        if (n == 0 && ferror(s->f)) return read_error(s, err);
        if (n == 0) s->eof = true;
        *got += n;
    }
    return 0;
}

/* ---- whole files, sizes ---- */

int mt_data_file_read(const char *path, char **buf, size_t *len, mt_error *err) {
    mt_compression c;
    if (mt_data_file_compression(path, &c, err)) return -1;
    if (c == MT_COMPRESS_NONE) return mt_read_file(path, buf, len, err);
    stream s;
    if (stream_open(&s, path, err)) return -1;
    char *p = NULL;
    size_t n = 0, cap = 0, got;
    int rc = 0;
    do {
        if (cap - n < CHUNK + 1) {  // one byte always kept for the NUL
            MT_ASSERT(mt_mul_size(cap ? cap : CHUNK, 2, &cap));
            p = mt_realloc_or_die(p, cap);
        }
        rc = stream_read(&s, p + n, cap - n - 1, &got, err);
        n += got;
    } while (!rc && !s.eof);
    stream_close(&s);
    if (rc) {
        free(p);
        return -1;
    }
    p[n] = 0;
    *buf = p, *len = n;
    return 0;
}

int mt_data_file_head(const char *path, void *buf, size_t n, size_t *got, mt_error *err) {
    stream s;
    if (stream_open(&s, path, err)) return -1;
    int rc = stream_read(&s, buf, n, got, err);
    stream_close(&s);
    return rc;
}

int mt_data_file_size(const char *path, uint64_t cap, uint64_t *size, mt_error *err) {
    stream s;
    if (stream_open(&s, path, err)) return -1;
    *size = 0;
    int rc = 0;
    if (s.c == MT_COMPRESS_NONE) {
        struct stat st;
        if (fstat(fileno(s.f), &st)) rc = mt_errorf(err, "%s: %s", path, strerror(errno));
        else *size = (uint64_t)st.st_size;
        stream_close(&s);
        return rc;
    }
    char *scratch = mt_malloc_or_die(CHUNK);
    while (!rc && !s.eof && *size <= cap) {
        size_t got;
        rc = stream_read(&s, scratch, CHUNK, &got, err);
        *size += got;
    }
    free(scratch);
    stream_close(&s);
    return rc;
}

/* ---- lines ---- */

struct mt_line_reader {
    stream s;
    char *path;
    size_t max_line;
    char *buf;          // (cap) buf[0..len): the lines handed out last, then what follows
    size_t len, cap;
    size_t given;       // bytes of buf handed out by the last call
    uint64_t lines, bytes;
};

mt_line_reader *mt_line_reader_open(const char *path, size_t max_line, mt_error *err) {
    mt_line_reader *r = mt_calloc_or_die(1, sizeof *r);
    r->path = mt_strdup_or_die(path);
    r->max_line = max_line;
    if (stream_open(&r->s, r->path, err)) {
        free(r->path);
        free(r);
        return NULL;
    }
    return r;
}

mt_line_reader *mt_line_reader_open_memory(const char *name, const char *buf, size_t len,
                                           size_t max_line, mt_error *err) {
    mt_line_reader *r = mt_calloc_or_die(1, sizeof *r);
    r->path = mt_strdup_or_die(name);
    r->max_line = max_line;
    r->s.path = r->path;
    r->s.zr = Z_OK;
    /* an empty buffer is one without lines: at its end at once */
    r->s.eof = len == 0;
    if (len && !(r->s.f = fmemopen((void *)buf, len, "rb"))) {
        mt_errorf(err, "%s: cannot read from memory: %s", name, strerror(errno));
        free(r->path);
        free(r);
        return NULL;
    }
    return r;
}

void mt_line_reader_close(mt_line_reader *r) {
    if (!r) return;
    stream_close(&r->s);
    free(r->buf);
    free(r->path);
    free(r);
}

uint64_t mt_line_reader_lines(const mt_line_reader *r) { return r->lines; }
uint64_t mt_line_reader_bytes(const mt_line_reader *r) { return r->bytes; }

static int too_long(const mt_line_reader *r, uint64_t line, mt_error *err) {
    char mib[32] = "";
    if (r->max_line >= ((size_t)1 << 20))
        snprintf(mib, sizeof mib, " (%zu MiB)", r->max_line >> 20);
    return mt_errorf(err, "%s:%llu: the line is longer than %zu bytes%s, the most a line (one "
                     "document) may hold: a file without line breaks, or one that expands to "
                     "much more than it looks; split the document into lines", r->path,
                     (unsigned long long)line, r->max_line, mib);
}

/* Counts the lines of lines[0..n) into r->lines, checking their lengths
 * ('\r' before '\n' is not counted, as the JSONL reader drops it). */
static int count_lines(mt_line_reader *r, const char *lines, size_t n, mt_error *err) {
    for (size_t i = 0; i < n;) {
        const char *nl = memchr(lines + i, '\n', n - i);
        size_t e = nl ? (size_t)(nl - lines) : n, l = e - i;
        if (l && lines[e - 1] == '\r') l--;
        if (l > r->max_line) return too_long(r, r->lines + 1, err);
        r->lines++;
        i = e + 1;
    }
    return 0;
}

int mt_line_reader_next(mt_line_reader *r, size_t want, const char **lines, size_t *len,
                        mt_error *err) {
    /* drop the lines handed out last; what is left is the start of a line
     * (it holds no '\n') */
    if (r->given) memmove(r->buf, r->buf + r->given, r->len - r->given);
    r->len -= r->given;
    r->given = 0;
    size_t scanned = r->len, end = 0;  // end: after the last '\n' found
    for (;;) {
        if (end && (r->len >= want || r->s.eof)) break;
        if (r->s.eof) {
            if (r->len == 0) return 1;
            end = r->len;  // the last line, without '\n'
            break;
        }
        if (r->len - end > r->max_line + 1) { /* + 1: a '\r' before the '\n' */
            /* the first line too long is named: one before this one, or this one */
            if (count_lines(r, r->buf, end, err)) return -1;
            return too_long(r, r->lines + 1, err);
        }
        if (r->cap - r->len < CHUNK) {
            size_t cap;
            MT_ASSERT(mt_mul_size(r->cap ? r->cap : CHUNK, 2, &cap));
            r->buf = mt_realloc_or_die(r->buf, cap);
            r->cap = cap;
        }
        size_t got;
        if (stream_read(&r->s, r->buf + r->len, CHUNK, &got, err)) return -1;
        r->len += got;
        const char *nl = got ? memrchr(r->buf + scanned, '\n', r->len - scanned) : NULL;
        if (nl) end = (size_t)(nl - r->buf) + 1;
        scanned = r->len;
    }
    if (count_lines(r, r->buf, end, err)) return -1;
    r->given = end;
    r->bytes += end;
    *lines = r->buf, *len = end;
    return 0;
}

int mt_data_file_is_shard(const char *name, mt_error *err) {
    static const char *const bases[] = {".jsonl", ".mtok"};
    static const char *const zips[] = {"", ".gz", ".zst"};
    for (int b = 0; b < 2; b++)
        for (int z = 0; z < 3; z++) {
            char suffix[16];
            snprintf(suffix, sizeof suffix, "%s%s", bases[b], zips[z]);
            if (ends_with(name, suffix)) return 1;
        }
    for (size_t i = 0; i < sizeof others / sizeof *others; i++) {
        const char *s = others[i].suffix;
        char a[16], b[16];
        snprintf(a, sizeof a, ".jsonl%s", s);
        snprintf(b, sizeof b, ".mtok%s", s);
        if (ends_with(name, a) || ends_with(name, b)) return unsupported(name, &others[i], err);
    }
    return 0;
}
