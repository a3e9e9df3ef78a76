/* Decoding ids -> text, as HF Tokenizer.decode: drop unknown ids (and
 * special added tokens when asked), spell the rest as in tokenizer.json, run
 * the decoder chain over that list of strings, and concatenate (or join with
 * spaces when the file has no decoder). */
#include "data/tokenizer_internal.h"

#include <stdlib.h>
#include <string.h>

#include "util/mem.h"

/* A list of byte strings in one buffer: string i is buf[off[i]..off[i+1]). */
typedef struct toklist {
    char *buf;
    size_t len, cap;
    size_t *off;  // (n + 1)
    size_t n, ncap;
} toklist;

static void tl_init(toklist *t) {
    memset(t, 0, sizeof *t);
    t->ncap = 16;
    t->off = mt_malloc_or_die(t->ncap * sizeof *t->off);
    t->off[0] = 0;
}

static void tl_free(toklist *t) {
    free(t->buf);
    free(t->off);
}

/* Appends bytes to the string being built (the last, open one). */
static void tl_add(toklist *t, const char *s, size_t len) {
    if (len == 0) return;  // s may be NULL then
    if (t->len + len > t->cap) {
        t->cap = (t->len + len) * 2 + 64;
        t->buf = mt_realloc_or_die(t->buf, t->cap);
    }
    memcpy(t->buf + t->len, s, len);
    t->len += len;
}

/* Closes the open string. */
static void tl_end(toklist *t) {
    if (t->n + 2 > t->ncap) {
        t->ncap *= 2;
        t->off = mt_realloc_or_die(t->off, t->ncap * sizeof *t->off);
    }
    t->off[++t->n] = t->len;
}

static inline const char *tl_str(const toklist *t, size_t i, size_t *len) {
    *len = t->off[i + 1] - t->off[i];
    return t->buf ? t->buf + t->off[i] : "";  /* only empty strings so far: no buffer yet */
}

/* Rust's String::from_utf8_lossy: each maximal invalid subsequence -> U+FFFD. */
static void add_utf8_lossy(toklist *out, const char *s, size_t len) {
    const unsigned char *u = (const unsigned char *)s;
    for (size_t i = 0; i < len;) {
        unsigned c = u[i];
        size_t need = c < 0x80 ? 1 : c >= 0xC2 && c <= 0xDF ? 2 : c >= 0xE0 && c <= 0xEF ? 3
                    : c >= 0xF0 && c <= 0xF4 ? 4 : 0;
        size_t k = need ? 1 : 0;
        while (k > 0 && k < need && i + k < len) {
            unsigned lo = 0x80, hi = 0xBF;
            if (k == 1 && c == 0xE0) lo = 0xA0;
            if (k == 1 && c == 0xED) hi = 0x9F;
            if (k == 1 && c == 0xF0) lo = 0x90;
            if (k == 1 && c == 0xF4) hi = 0x8F;
            if (u[i + k] < lo || u[i + k] > hi) break;
            k++;
        }
        if (need && k == need) {
            tl_add(out, s + i, k);
        } else {
            tl_add(out, "\xEF\xBF\xBD", 3);
            k = k ? k : 1;
        }
        i += k;
    }
}

static void dec_replace(const mt_tok_dec *d, const toklist *in, toklist *out) {
    for (size_t i = 0; i < in->n; i++) {
        size_t len;
        const char *s = tl_str(in, i, &len);
        for (size_t j = 0; j < len;) {
            if (j + d->alen <= len && memcmp(s + j, d->a, d->alen) == 0) {
                tl_add(out, d->b, d->blen);
                j += d->alen;
            } else {
                tl_add(out, s + j++, 1);
            }
        }
        tl_end(out);
    }
}

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* Runs of "<0xNN>" become their bytes when those form valid UTF-8, else one
 * U+FFFD per byte. */
static void flush_bytes(toklist *out, const char *bytes, size_t n) {
    if (n == 0) return;
    toklist probe;  // valid iff lossy decoding keeps every byte
    tl_init(&probe);
    add_utf8_lossy(&probe, bytes, n);
    bool valid = probe.len == n && memcmp(probe.buf, bytes, n) == 0;
    tl_free(&probe);
    if (valid) {
        tl_add(out, bytes, n);
        tl_end(out);
    } else {
        for (size_t i = 0; i < n; i++) {
            tl_add(out, "\xEF\xBF\xBD", 3);
            tl_end(out);
        }
    }
}

static void dec_bytefallback(const toklist *in, toklist *out) {
    char *bytes = mt_malloc_or_die(in->n + 1);
    size_t nb = 0;
    for (size_t i = 0; i < in->n; i++) {
        size_t len;
        const char *s = tl_str(in, i, &len);
        int hi = len == 6 ? hexval(s[3]) : -1, lo = len == 6 ? hexval(s[4]) : -1;
        if (len == 6 && memcmp(s, "<0x", 3) == 0 && s[5] == '>' && hi >= 0 && lo >= 0) {
            bytes[nb++] = (char)(hi * 16 + lo);
            continue;
        }
        flush_bytes(out, bytes, nb);
        nb = 0;
        tl_add(out, s, len);
        tl_end(out);
    }
    flush_bytes(out, bytes, nb);
    free(bytes);
}

static void dec_fuse(const toklist *in, toklist *out) {
    tl_add(out, in->buf, in->len);
    tl_end(out);
}

/* Removes up to start leading and stop trailing copies of one char. */
static void dec_strip(const mt_tok_dec *d, const toklist *in, toklist *out) {
    for (size_t i = 0; i < in->n; i++) {
        size_t len;
        const char *s = tl_str(in, i, &len);
        size_t b = 0, e = len;
        for (size_t k = 0; k < d->start && e - b >= d->alen && memcmp(s + b, d->a, d->alen) == 0; k++)
            b += d->alen;
        for (size_t k = 0; k < d->stop && e - b >= d->alen && memcmp(s + e - d->alen, d->a, d->alen) == 0; k++)
            e -= d->alen;
        tl_add(out, s + b, e - b);
        tl_end(out);
    }
}

/* ByteLevel: every char back to its byte (a token with a char outside the
 * alphabet keeps its UTF-8 bytes), all tokens fused, then lossy UTF-8. */
static void dec_bytelevel(const toklist *in, toklist *out) {
    char *raw = mt_malloc_or_die(in->len + 1);
    size_t nr = 0;
    for (size_t i = 0; i < in->n; i++) {
        size_t len, start = nr;
        const char *s = tl_str(in, i, &len);
        for (size_t j = 0; j < len;) {
            uint32_t cp;
            j += mt_tok_utf8_next(s + j, len - j, &cp);
            int b = mt_tok_cp_to_byte(cp);
            if (b < 0) {
                nr = start;
                memcpy(raw + nr, s, len);
                nr += len;
                break;
            }
            raw[nr++] = (char)b;
        }
    }
    add_utf8_lossy(out, raw, nr);
    tl_end(out);
    free(raw);
}

static char *decode_bytes_tokenizer(const int32_t *ids, size_t n, bool skip_special) {
    toklist raw, out;
    tl_init(&raw);
    tl_init(&out);
    for (size_t i = 0; i < n; i++) {
        if (ids[i] >= 0 && ids[i] < 256) {
            char c = (char)ids[i];
            tl_add(&raw, &c, 1);
        } else if (!skip_special && (ids[i] == 256 || ids[i] == 257)) {
            tl_add(&raw, ids[i] == 256 ? "<s>" : "</s>", ids[i] == 256 ? 3 : 4);
        }
    }
    add_utf8_lossy(&out, raw.buf, raw.len);
    tl_add(&out, "", 1);  // NUL
    char *s = out.buf;
    out.buf = NULL;
    tl_free(&raw);
    tl_free(&out);
    return s;
}

char *mt_tokenizer_decode(const mt_tokenizer *tok, const int32_t *ids, size_t n, bool skip_special) {
    if (tok->is_bytes) return decode_bytes_tokenizer(ids, n, skip_special);
    toklist cur, next;
    tl_init(&cur);
    for (size_t i = 0; i < n; i++) {
        int32_t id = ids[i];
        if (id < 0 || (size_t)id >= tok->vocab_size || !tok->id_exists[id]) continue;
        if (skip_special && tok->id_special[id]) continue;
        tl_add(&cur, tok->id_arena + tok->id_off[id], tok->id_off[id + 1] - tok->id_off[id]);
        tl_end(&cur);
    }
    for (size_t k = 0; k < tok->n_decs; k++) {
        const mt_tok_dec *d = &tok->decs[k];
        tl_init(&next);
        switch (d->kind) {
        case MT_DEC_REPLACE: dec_replace(d, &cur, &next); break;
        case MT_DEC_BYTEFALLBACK: dec_bytefallback(&cur, &next); break;
        case MT_DEC_FUSE: dec_fuse(&cur, &next); break;
        case MT_DEC_STRIP: dec_strip(d, &cur, &next); break;
        case MT_DEC_BYTELEVEL: dec_bytelevel(&cur, &next); break;
        default: MT_DIE("unknown decoder kind %d", d->kind);
        }
        tl_free(&cur);
        cur = next;
    }
    toklist out;
    tl_init(&out);
    for (size_t i = 0; i < cur.n; i++) {
        size_t len;
        const char *s = tl_str(&cur, i, &len);
        if (i > 0 && !tok->has_decoder) tl_add(&out, " ", 1);  // HF joins with spaces
        tl_add(&out, s, len);
    }
    tl_add(&out, "", 1);  // NUL
    char *s = out.buf;
    out.buf = NULL;
    tl_free(&cur);
    tl_free(&out);
    return s;
}
