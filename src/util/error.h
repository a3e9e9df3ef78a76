/* Errors and invariants.
 *
 * Recoverable errors (bad input, missing file) are reported by returning -1
 * and filling an mt_error with a message that names the input, the problem
 * and the fix. Broken invariants (a bug in megatrain) abort with file:line:
 * MT_ASSERT stays on in release builds. */
#ifndef MT_UTIL_ERROR_H
#define MT_UTIL_ERROR_H

#include <stddef.h>

#ifdef __cplusplus
#ifndef _Noreturn
#define _Noreturn [[noreturn]]
#endif
extern "C" {
#endif

typedef struct mt_error {
    char msg[1024];
} mt_error;

/* Formats a message into err (which may be NULL) and returns -1, so that
 * callers can write `return mt_errorf(err, "...", ...);`. */
int mt_errorf(mt_error *err, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Prefixes the message already in err with more context ("loading X: "). */
int mt_error_prefix(mt_error *err, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Appends more to the message already in err ("; the run stopped"). */
int mt_error_suffix(mt_error *err, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

_Noreturn void mt_die(const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#define MT_ASSERT(cond)                                                       \
    do {                                                                      \
        if (!(cond)) mt_die(__FILE__, __LINE__, "assertion failed: %s", #cond); \
    } while (0)

#define MT_DIE(...) mt_die(__FILE__, __LINE__, __VA_ARGS__)

#ifdef __cplusplus
}
#endif

#endif
