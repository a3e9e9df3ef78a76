/* Data files read whole, with gzip (zlib) and zstd (libzstd) decompression
 * streamed from the file in chunks; see data_file.h. */
#include "data/data_file.h"

#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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

/* A growing output buffer; one byte is always kept for the NUL. */
typedef struct out_buf {
    char *p;
    size_t len, cap;
} out_buf;

static void out_reserve(out_buf *o, size_t more) {
    size_t need;
    MT_ASSERT(mt_add_size(o->len, more + 1, &need));
    if (need <= o->cap) return;
    size_t cap = o->cap ? o->cap : CHUNK;
    while (cap < need) MT_ASSERT(mt_mul_size(cap, 2, &cap));
    o->p = mt_realloc_or_die(o->p, cap);
    o->cap = cap;
}

/* Room for the next call (at least a chunk, at most what a uInt holds). */
static size_t out_room(out_buf *o) {
    out_reserve(o, CHUNK);
    size_t room = o->cap - o->len - 1;
    return room > ((size_t)1 << 30) ? (size_t)1 << 30 : room;
}

static int read_error(const char *path, FILE *f, mt_error *err) {
    int rc = mt_errorf(err, "%s: read error: %s", path, strerror(errno));
    fclose(f);
    return rc;
}

/* gzip: one member after another until the input ends; zlib checks each
 * member's CRC-32 and length. */
static int inflate_file(const char *path, FILE *f, out_buf *o, mt_error *err) {
    z_stream z = {0};
    MT_ASSERT(inflateInit2(&z, 15 + 16) == Z_OK);
    unsigned char *in = mt_malloc_or_die(CHUNK);
    uint64_t consumed = 0;  // compressed bytes before in[0]
    int zr = Z_OK, rc = -1;
    bool in_member = false, full = false;  // full: output may be pending
    for (;;) {
        if (z.avail_in == 0 && !full) {
            consumed += (uint64_t)(z.next_in ? z.next_in - in : 0);
            size_t got = fread(in, 1, CHUNK, f);
            if (got == 0 && ferror(f)) {
                free(in);
                inflateEnd(&z);
                return read_error(path, f, err);
            }
            if (got == 0) break;
            z.next_in = in, z.avail_in = (uInt)got;
        }
        if (!in_member && zr == Z_STREAM_END) inflateReset(&z);
        size_t room = out_room(o);
        z.next_out = (Bytef *)o->p + o->len;
        z.avail_out = (uInt)room;
        zr = inflate(&z, Z_NO_FLUSH);
        o->len += room - z.avail_out;
        full = z.avail_out == 0 && zr != Z_STREAM_END;
        in_member = zr == Z_OK || zr == Z_BUF_ERROR;
        if (zr != Z_OK && zr != Z_STREAM_END && zr != Z_BUF_ERROR) {
            mt_errorf(err, "%s: corrupt gzip data near compressed byte %llu (zlib: %s): the file "
                      "is damaged; re-create or re-download it", path,
                      (unsigned long long)(consumed + (uint64_t)(z.next_in - in)),
                      z.msg ? z.msg : zError(zr));
            goto done;
        }
    }
    if (in_member) {
        mt_errorf(err, "%s: the gzip data ends early after %llu compressed bytes (truncated "
                  "file): re-create or re-download it", path, (unsigned long long)consumed);
        goto done;
    }
    rc = 0;
done:
    free(in);
    inflateEnd(&z);
    fclose(f);
    return rc;
}

/* zstd: frames one after the other; a frame's checksum, when it has one,
 * is checked by libzstd. */
static int unzstd_file(const char *path, FILE *f, out_buf *o, mt_error *err) {
    ZSTD_DCtx *z = ZSTD_createDCtx();
    MT_ASSERT(z);
    unsigned char *in = mt_malloc_or_die(CHUNK);
    uint64_t consumed = 0;
    size_t zr = 0;
    int rc = -1;
    bool full = false;  // output may be pending
    ZSTD_inBuffer ib = {in, 0, 0};
    for (;;) {
        if (ib.pos == ib.size && !full) {
            consumed += ib.size;
            size_t got = fread(in, 1, CHUNK, f);
            if (got == 0 && ferror(f)) {
                free(in);
                ZSTD_freeDCtx(z);
                return read_error(path, f, err);
            }
            if (got == 0) break;
            ib.size = got, ib.pos = 0;
        }
        size_t room = out_room(o);  // may move o->p
        ZSTD_outBuffer ob = {o->p + o->len, room, 0};
        zr = ZSTD_decompressStream(z, &ob, &ib);
        o->len += ob.pos;
        full = ob.pos == ob.size && zr != 0;
        if (ZSTD_isError(zr)) {
            mt_errorf(err, "%s: corrupt zstd data near compressed byte %llu (zstd: %s): the file "
                      "is damaged; re-create or re-download it", path,
                      (unsigned long long)(consumed + ib.pos), ZSTD_getErrorName(zr));
            goto done;
        }
    }
    /* zr is 0 only where a frame ended; anything else is a cut frame */
    if (zr != 0) {
        mt_errorf(err, "%s: the zstd data ends early after %llu compressed bytes (truncated "
                  "file): re-create or re-download it", path, (unsigned long long)consumed);
        goto done;
    }
    rc = 0;
done:
    free(in);
    ZSTD_freeDCtx(z);
    fclose(f);
    return rc;
}

int mt_data_file_read(const char *path, char **buf, size_t *len, mt_error *err) {
    mt_compression c;
    if (mt_data_file_compression(path, &c, err)) return -1;
    if (c == MT_COMPRESS_NONE) return mt_read_file(path, buf, len, err);
    FILE *f = fopen(path, "rb");
    if (!f) return mt_errorf(err, "%s: cannot open: %s", path, strerror(errno));
    out_buf o = {0};
    out_reserve(&o, 0);
    int rc = c == MT_COMPRESS_GZIP ? inflate_file(path, f, &o, err) : unzstd_file(path, f, &o, err);
    if (rc) {
        free(o.p);
        return -1;
    }
    o.p[o.len] = 0;
    *buf = o.p, *len = o.len;
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
