/* Error formatting and the abort path for broken invariants. */
#include "util/error.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int mt_errorf(mt_error *err, const char *fmt, ...) {
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err->msg, sizeof err->msg, fmt, ap);
        va_end(ap);
    }
    return -1;
}

int mt_error_prefix(mt_error *err, const char *fmt, ...) {
    if (!err) return -1;
    char prefix[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    /* Shift the old message right and put the prefix in front; the result
     * is cut at the buffer's end. */
    size_t np = strlen(prefix), cap = sizeof err->msg;
    if (np >= cap) np = cap - 1;
    size_t no = strnlen(err->msg, cap - 1);
    if (np + no >= cap) no = cap - 1 - np;
    memmove(err->msg + np, err->msg, no);
    memcpy(err->msg, prefix, np);
    err->msg[np + no] = 0;
    return -1;
}

int mt_error_suffix(mt_error *err, const char *fmt, ...) {
    if (!err) return -1;
    size_t n = strnlen(err->msg, sizeof err->msg - 1);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->msg + n, sizeof err->msg - n, fmt, ap);
    va_end(ap);
    return -1;
}

void mt_die(const char *file, int line, const char *fmt, ...) {
    fprintf(stderr, "megatrain: internal error at %s:%d: ", file, line);
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    abort();
}
