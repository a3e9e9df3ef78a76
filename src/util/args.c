/* Strict number parsing for command-line options (util/options.c): "12x",
 * "" and overflow are errors, not 12 or 0. */
#include "util/args.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>

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
    if (end == text || *end || !isfinite(v) || (errno && v != 0)) *bad = 1;
    return v;
}
