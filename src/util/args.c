/* Strict number parsing for command-line options (util/options.c): "12x",
 * "" and overflow are errors, not 12 or 0; numbers are written in decimal. */
#include "util/args.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>

bool mt_decimal_text(const char *s) {
    if (*s == '+' || *s == '-') s++;
    size_t digits = 0;
    while (isdigit((unsigned char)*s)) s++, digits++;
    if (*s == '.') {
        s++;
        while (isdigit((unsigned char)*s)) s++, digits++;
    }
    if (!digits) return false;
    if (*s == 'e' || *s == 'E') {
        s++;
        if (*s == '+' || *s == '-') s++;
        if (!isdigit((unsigned char)*s)) return false;
        while (isdigit((unsigned char)*s)) s++;
    }
    return *s == 0;
}

long long mt_arg_ll(const char *text, int *bad) {
    char *end;
    errno = 0;
    long long v = strtoll(text, &end, 10);
    if (end == text || *end || errno) *bad = 1;
    return v;
}

double mt_arg_d(const char *text, int *bad) {
    char *end;
    errno = 0;
    double v = strtod(text, &end);
    if (!mt_decimal_text(text) || end == text || *end || !isfinite(v) || (errno && v != 0))
        *bad = 1;
    return v;
}
