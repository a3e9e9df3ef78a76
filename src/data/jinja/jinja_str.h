/* Python's str methods on UTF-8 bytes: what chat templates call on message
 * text (strip, split, startswith, upper, title, ...), character counting
 * and indexing by code point, and the character classes Python uses
 * (str.isspace, str.isprintable through utf8proc), and the byte buffer the
 * engine writes text into. Leaf of the engine: no values, only bytes in and
 * bytes out. */
#ifndef MT_DATA_JINJA_STR_H
#define MT_DATA_JINJA_STR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* A growable byte buffer (heap, not the pool). */
typedef struct mt_jbuf {
    char *p;
    size_t n, cap;
} mt_jbuf;

void mt_jbuf_put(mt_jbuf *b, const char *s, size_t n);
void mt_jbuf_puts(mt_jbuf *b, const char *s);
void mt_jbuf_putc(mt_jbuf *b, char c);
void mt_jbuf_free(mt_jbuf *b);

/* The code point at s[i] (len bytes in all) and its length in *n; a byte
 * that starts no valid sequence is one unit (U+FFFD). */
uint32_t mt_jstr_cp(const char *s, size_t len, size_t i, size_t *n);
/* Appends code point cp as UTF-8. */
void mt_jstr_put_cp(mt_jbuf *b, uint32_t cp);
/* Code points in s[0..len). */
size_t mt_jstr_count(const char *s, size_t len);
/* Byte offset of code point k (k <= count). */
size_t mt_jstr_offset(const char *s, size_t len, size_t k);

/* str.isspace() of one code point. */
bool mt_jstr_isspace(uint32_t cp);
/* str.isprintable() of one code point (what repr leaves unescaped). */
bool mt_jstr_isprintable(uint32_t cp);

/* str.strip/lstrip/rstrip: shrinks [*off, *off + *len) of s; chars NULL
 * strips whitespace, else any code point of chars[0..nchars). */
void mt_jstr_strip(const char *s, size_t *off, size_t *len, bool left, bool right,
                   const char *chars, size_t nchars);

/* Finds needle in s from byte `from`: its byte offset, or -1. */
long mt_jstr_find(const char *s, size_t len, const char *needle, size_t nlen, size_t from);

/* str.upper(), str.lower(), str.capitalize(), str.title(), appended to
 * b. The case mappings are utf8proc's one-to-one ones: Python's few
 * one-to-many ones ('ß'.upper() == 'SS', the ligatures) are not made. */
void mt_jstr_upper(mt_jbuf *b, const char *s, size_t len);
void mt_jstr_lower(mt_jbuf *b, const char *s, size_t len);
void mt_jstr_capitalize(mt_jbuf *b, const char *s, size_t len);
void mt_jstr_title(mt_jbuf *b, const char *s, size_t len);

/* Python's repr of a string (quotes chosen as Python does), appended. */
void mt_jstr_repr(mt_jbuf *b, const char *s, size_t len);

#endif
