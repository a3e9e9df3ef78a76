/* Characters: the ByteLevel alphabet (a visible char for every byte) and
 * UTF-8 decoding and validation, shared by loading, encoding and decoding.
 * Depends on nothing else of the tokenizer. */
#include "data/tokenizer_internal.h"

#include <string.h>

/* ---- ByteLevel alphabet (GPT-2 bytes_to_unicode) ---- */

/* Printable bytes stand for themselves; the other 68 bytes are given code
 * points 256, 257, ... in byte order so every byte is a visible char. */
static bool byte_is_printable(int b) {
    return (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
}

/* The 68 non-printable bytes are 0..32, 127..160 and 173, numbered 256.. */
uint32_t mt_tok_byte_to_cp(uint8_t b) {
    if (byte_is_printable(b)) return b;
    if (b <= 32) return 256u + b;
    if (b <= 160) return 256u + 33 + (b - 127u);
    return 256u + 67;  // 173
}

int mt_tok_cp_to_byte(uint32_t cp) {
    if (cp < 256) return byte_is_printable((int)cp) ? (int)cp : -1;
    if (cp < 256 + 33) return (int)(cp - 256);
    if (cp < 256 + 67) return (int)(cp - 256 - 33 + 127);
    return cp == 256 + 67 ? 173 : -1;
}

size_t mt_tok_utf8_next(const char *s, size_t len, uint32_t *cp) {
    const unsigned char *u = (const unsigned char *)s;
    size_t n = u[0] < 0x80 ? 1 : u[0] < 0xE0 ? 2 : u[0] < 0xF0 ? 3 : 4;
    if (n > len) n = len;
    uint32_t c = n == 1 ? u[0] : u[0] & (0x7F >> n);
    for (size_t i = 1; i < n; i++) c = (c << 6) | (u[i] & 0x3F);
    *cp = c;
    return n;
}

/* ---- UTF-8 validation (as Rust's str: no overlongs, surrogates, > U+10FFFF) ---- */

/* Offset of the first invalid byte, or len when s is valid. */
size_t mt_tok_utf8_invalid_at(const char *s, size_t len) {
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0;
    while (i < len) {
        if (i + 8 <= len) {  // skip ASCII eight bytes at a time
            uint64_t w;
            memcpy(&w, u + i, 8);
            if (!(w & 0x8080808080808080ull)) { i += 8; continue; }
        }
        unsigned c = u[i];
        if (c < 0x80) { i++; continue; }
        size_t n = c >= 0xC2 && c <= 0xDF ? 2 : c >= 0xE0 && c <= 0xEF ? 3 : c >= 0xF0 && c <= 0xF4 ? 4 : 0;
        if (n == 0 || i + n > len) return i;
        unsigned lo = 0x80, hi = 0xBF;  // allowed range of the second byte
        if (c == 0xE0) lo = 0xA0;
        if (c == 0xED) hi = 0x9F;
        if (c == 0xF0) lo = 0x90;
        if (c == 0xF4) hi = 0x8F;
        if (u[i + 1] < lo || u[i + 1] > hi) return i;
        for (size_t k = 2; k < n; k++)
            if ((u[i + k] & 0xC0) != 0x80) return i;
        i += n;
    }
    return len;
}
