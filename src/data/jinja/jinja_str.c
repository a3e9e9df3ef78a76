/* Python's str methods on UTF-8 bytes (see jinja_str.h). Character classes
 * and case mappings come from utf8proc; whitespace is Python's
 * str.isspace set, which differs from both C's isspace and Unicode's
 * White_Space (it adds the separators U+001C..U+001F). */
#include "data/jinja/jinja_str.h"

#include <stdio.h>
#include <string.h>
#include <stdlib.h>
#include <utf8proc.h>

#include "util/mem.h"

/* ---- buffers ---- */

void mt_jbuf_put(mt_jbuf *b, const char *s, size_t n) {
    if (b->n + n + 1 > b->cap) {
        b->cap = (b->n + n + 1) * 2;
        b->p = mt_realloc_or_die(b->p, b->cap);
    }
    if (n) memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}

void mt_jbuf_puts(mt_jbuf *b, const char *s) { mt_jbuf_put(b, s, strlen(s)); }
void mt_jbuf_putc(mt_jbuf *b, char c) { mt_jbuf_put(b, &c, 1); }

void mt_jbuf_free(mt_jbuf *b) {
    free(b->p);
    memset(b, 0, sizeof *b);
}

uint32_t mt_jstr_cp(const char *s, size_t len, size_t i, size_t *n) {
    const unsigned char *u = (const unsigned char *)s;
    unsigned c = u[i];
    size_t k = c < 0x80 ? 1 : c >> 5 == 6 ? 2 : c >> 4 == 14 ? 3 : c >> 3 == 30 ? 4 : 0;
    if (k == 0 || i + k > len) {
        *n = 1;
        return c < 0x80 ? c : 0xFFFD;
    }
    uint32_t cp = k == 1 ? c : c & (0x7Fu >> k);
    for (size_t j = 1; j < k; j++) {
        if ((u[i + j] & 0xC0) != 0x80) {
            *n = 1;
            return 0xFFFD;
        }
        cp = cp << 6 | (u[i + j] & 0x3F);
    }
    *n = k;
    return cp;
}

void mt_jstr_put_cp(mt_jbuf *b, uint32_t cp) {
    char t[4];
    size_t n;
    if (cp < 0x80) t[0] = (char)cp, n = 1;
    else if (cp < 0x800) t[0] = (char)(0xC0 | cp >> 6), t[1] = (char)(0x80 | (cp & 0x3F)), n = 2;
    else if (cp < 0x10000)
        t[0] = (char)(0xE0 | cp >> 12), t[1] = (char)(0x80 | (cp >> 6 & 0x3F)),
        t[2] = (char)(0x80 | (cp & 0x3F)), n = 3;
    else
        t[0] = (char)(0xF0 | cp >> 18), t[1] = (char)(0x80 | (cp >> 12 & 0x3F)),
        t[2] = (char)(0x80 | (cp >> 6 & 0x3F)), t[3] = (char)(0x80 | (cp & 0x3F)), n = 4;
    mt_jbuf_put(b, t, n);
}

size_t mt_jstr_count(const char *s, size_t len) {
    size_t k = 0, n;
    for (size_t i = 0; i < len; i += n, k++) mt_jstr_cp(s, len, i, &n);
    return k;
}

size_t mt_jstr_offset(const char *s, size_t len, size_t k) {
    size_t i = 0, n;
    for (; k > 0 && i < len; k--, i += n) mt_jstr_cp(s, len, i, &n);
    return i;
}

bool mt_jstr_isspace(uint32_t cp) {
    return (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x20) || cp == 0x85 ||
           cp == 0xA0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 ||
           cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

bool mt_jstr_isprintable(uint32_t cp) {
    if (cp == ' ') return true;
    switch (utf8proc_category((utf8proc_int32_t)cp)) {
    case UTF8PROC_CATEGORY_CC: case UTF8PROC_CATEGORY_CF: case UTF8PROC_CATEGORY_CS:
    case UTF8PROC_CATEGORY_CO: case UTF8PROC_CATEGORY_CN: case UTF8PROC_CATEGORY_ZL:
    case UTF8PROC_CATEGORY_ZP: case UTF8PROC_CATEGORY_ZS:
        return false;
    default:
        return true;
    }
}

static bool in_chars(uint32_t cp, const char *chars, size_t nchars) {
    size_t n;
    for (size_t i = 0; i < nchars; i += n)
        if (mt_jstr_cp(chars, nchars, i, &n) == cp) return true;
    return false;
}

static bool strippable(uint32_t cp, const char *chars, size_t nchars) {
    return chars ? in_chars(cp, chars, nchars) : mt_jstr_isspace(cp);
}

void mt_jstr_strip(const char *s, size_t *off, size_t *len, bool left, bool right,
                   const char *chars, size_t nchars) {
    const char *u = s + *off;
    size_t a = 0, b = *len, n;
    while (left && a < b && strippable(mt_jstr_cp(u, b, a, &n), chars, nchars)) a += n;
    while (right && b > a) {
        size_t j = b - 1;
        while (j > a && ((unsigned char)u[j] & 0xC0) == 0x80) j--;  // start of the last code point
        if (!strippable(mt_jstr_cp(u, b, j, &n), chars, nchars)) break;
        b = j;
    }
    *off += a;
    *len = b - a;
}

long mt_jstr_find(const char *s, size_t len, const char *needle, size_t nlen, size_t from) {
    if (nlen == 0) return from <= len ? (long)from : -1;
    for (size_t i = from; i + nlen <= len; i++)
        if (s[i] == needle[0] && !memcmp(s + i, needle, nlen)) return (long)i;
    return -1;
}

/* ---- case ---- */

static bool is_cased(uint32_t cp) {
    utf8proc_category_t c = utf8proc_category((utf8proc_int32_t)cp);
    return c == UTF8PROC_CATEGORY_LU || c == UTF8PROC_CATEGORY_LL || c == UTF8PROC_CATEGORY_LT;
}

typedef utf8proc_int32_t (*case_fn)(utf8proc_int32_t);

static void map_all(mt_jbuf *b, const char *s, size_t len, case_fn f) {
    size_t n;
    for (size_t i = 0; i < len; i += n)
        mt_jstr_put_cp(b, (uint32_t)f((utf8proc_int32_t)mt_jstr_cp(s, len, i, &n)));
}

void mt_jstr_upper(mt_jbuf *b, const char *s, size_t len) { map_all(b, s, len, utf8proc_toupper); }
void mt_jstr_lower(mt_jbuf *b, const char *s, size_t len) { map_all(b, s, len, utf8proc_tolower); }

void mt_jstr_capitalize(mt_jbuf *b, const char *s, size_t len) {
    size_t n;
    for (size_t i = 0; i < len; i += n) {
        utf8proc_int32_t cp = (utf8proc_int32_t)mt_jstr_cp(s, len, i, &n);
        mt_jstr_put_cp(b, (uint32_t)(i == 0 ? utf8proc_totitle(cp) : utf8proc_tolower(cp)));
    }
}

/* Python's str.title(): a cased character after an uncased one is
 * titlecased, every other cased character lowercased. */
void mt_jstr_title(mt_jbuf *b, const char *s, size_t len) {
    size_t n;
    bool prev_cased = false;
    for (size_t i = 0; i < len; i += n) {
        uint32_t cp = mt_jstr_cp(s, len, i, &n);
        utf8proc_int32_t c = (utf8proc_int32_t)cp;
        mt_jstr_put_cp(b, (uint32_t)(prev_cased ? utf8proc_tolower(c) : utf8proc_totitle(c)));
        prev_cased = is_cased(cp);
    }
}

/* ---- repr ---- */

void mt_jstr_repr(mt_jbuf *b, const char *s, size_t len) {
    bool sq = memchr(s, '\'', len) != NULL, dq = memchr(s, '"', len) != NULL;
    char q = sq && !dq ? '"' : '\'';
    mt_jbuf_putc(b, q);
    size_t n;
    for (size_t i = 0; i < len; i += n) {
        uint32_t cp = mt_jstr_cp(s, len, i, &n);
        char t[16];
        if (cp == (uint32_t)q || cp == '\\') mt_jbuf_putc(b, '\\'), mt_jbuf_putc(b, (char)cp);
        else if (cp == '\n') mt_jbuf_puts(b, "\\n");
        else if (cp == '\r') mt_jbuf_puts(b, "\\r");
        else if (cp == '\t') mt_jbuf_puts(b, "\\t");
        else if (mt_jstr_isprintable(cp)) mt_jbuf_put(b, s + i, n);
        else {
            const char *fmt = cp < 0x100 ? "\\x%02x" : cp < 0x10000 ? "\\u%04x" : "\\U%08x";
            snprintf(t, sizeof t, fmt, cp);
            mt_jbuf_puts(b, t);
        }
    }
    mt_jbuf_putc(b, q);
}
