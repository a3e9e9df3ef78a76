/* Compressed data (gzip and zstd): the fuzzer writes the text, the harness
 * compresses it (in 1 to 4 members or frames) and, when asked, damages the
 * compressed bytes (a flipped byte or a cut); then every reader of
 * data_file.h reads it: whole, counted, and as lines with a small bound per
 * line and small blocks, and the JSONL reader of the data sets. Undamaged,
 * each must give back exactly the text (the line reader: its lines in
 * order, or the error naming the first line past the bound); damaged,
 * anything but a crash or a hang.
 *
 * Input: byte 0: bit 0 zstd, bits 1-2 members - 1, bit 3 damage, bit 4 cut
 * (else flip), bits 5-7 the line bound (4 << k bytes); bytes 1-2 the
 * damaged offset, byte 3 the block asked for; the rest is the text. */
#include <zlib.h>
#include <zstd.h>

#include "data/data_file.h"
#include "data/dataset.h"
#include "data/tokenizer.h"
#include "fuzz_util.h"

/* text as n members/frames into a malloc'd buffer. */
static unsigned char *compress_text(const uint8_t *text, size_t len, int zstd, int n,
                                    size_t *out_len) {
    size_t cap = 64 * (size_t)n + 2 * len + 1024, used = 0;
    unsigned char *out = malloc(cap);
    for (int m = 0; m < n; m++) {
        size_t a = len * (size_t)m / (size_t)n, b = len * (size_t)(m + 1) / (size_t)n;
        if (zstd) {
            size_t got = ZSTD_compress(out + used, cap - used, text + a, b - a, 1 + m);
            if (ZSTD_isError(got)) abort();
            used += got;
            continue;
        }
        z_stream z = {0};
        if (deflateInit2(&z, 1 + m, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY) != Z_OK) abort();
        z.next_in = (Bytef *)text + a, z.avail_in = (uInt)(b - a);
        z.next_out = out + used, z.avail_out = (uInt)(cap - used);
        if (deflate(&z, Z_FINISH) != Z_STREAM_END) abort();
        used = cap - z.avail_out;
        deflateEnd(&z);
    }
    *out_len = used;
    return out;
}

/* The lines of text[0..len) and the number of the first longer than max
 * (0: none), as the line reader counts them ('\r' before '\n' left out). */
static size_t count_lines(const uint8_t *text, size_t len, size_t max, size_t *first_long) {
    size_t n = 0;
    *first_long = 0;
    for (size_t i = 0; i < len;) {
        const uint8_t *nl = memchr(text + i, '\n', len - i);
        size_t e = nl ? (size_t)(nl - text) : len, l = e - i;
        if (l && text[e - 1] == '\r') l--;
        n++;
        if (l > max && !*first_long) *first_long = n;
        i = e + 1;
    }
    return n;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 4) return 0;
    int zstd = data[0] & 1, members = 1 + ((data[0] >> 1) & 3), damage = data[0] & 8;
    int cut = data[0] & 16;
    size_t max_line = (size_t)4 << (data[0] >> 5), at = (size_t)data[1] | (size_t)data[2] << 8;
    size_t want = 1 + data[3];
    const uint8_t *text = data + 4;
    size_t len = size - 4, clen;
    unsigned char *c = compress_text(text, len, zstd, members, &clen);
    if (damage && cut) clen = at % (clen + 1);
    else if (damage && clen) c[at % clen] ^= (unsigned char)(1 + data[3]);
    const char *path = fuzz_file(zstd ? "data.jsonl.zst" : "data.jsonl.gz", c, clen);
    free(c);
    mt_error err;

    char *buf;
    size_t got;
    int rc = mt_data_file_read(path, &buf, &got, &err);
    if (!damage && (rc || got != len || memcmp(buf, text, len))) abort();
    if (!rc) free(buf);

    uint64_t counted;
    rc = mt_data_file_size(path, UINT64_MAX, &counted, &err);
    if (!damage && (rc || counted != len)) abort();

    size_t first_long, lines = count_lines(text, len, max_line, &first_long);
    mt_line_reader *r = mt_line_reader_open(path, max_line, &err);
    if (!r) {
        if (!damage) abort();
    } else {
        const char *chunk;
        size_t n, pos = 0;
        while ((rc = mt_line_reader_next(r, want, &chunk, &n, &err)) == 0) {
            if (n == 0) abort(); /* a block is never empty */
            if (!damage && (pos + n > len || memcmp(chunk, text + pos, n))) abort();
            if (pos + n < len && chunk[n - 1] != '\n' && !damage) abort(); /* whole lines */
            pos += n;
        }
        if (!damage && first_long) {
            char want_msg[64];
            snprintf(want_msg, sizeof want_msg, ":%zu: the line is longer", first_long);
            if (rc != -1 || !strstr(err.msg, want_msg)) abort();
        } else if (!damage && (rc != 1 || pos != len || mt_line_reader_lines(r) != lines)) {
            abort();
        }
        mt_line_reader_close(r);
    }

    static mt_tokenizer *tok;
    if (!tok) tok = mt_tokenizer_bytes();
    mt_data_opts o = {.path = path, .seed = 1, .epochs = 1, .skip_bad_lines = data[3] & 1};
    mt_dataset *d = mt_dataset_open(&o, tok, 258, &err);
    if (d) mt_dataset_free(d);
    return 0;
}
