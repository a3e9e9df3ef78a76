/* Numbers on the command line: the whole argument must be the number. */
#ifndef MT_UTIL_ARGS_H
#define MT_UTIL_ARGS_H

#include <stdbool.h>

/* The integer (or number) in text; sets *bad (left alone otherwise) when
* text is empty, has trailing characters or is out of range. A number is
 * finite and written in decimal (strtod's hexadecimal, inf and nan are
 * refused: --lr 0x10 is not 16); one too small to represent reads as 0. */
long long mt_arg_ll(const char *text, int *bad);
double mt_arg_d(const char *text, int *bad);

/* Whether text is a decimal number: [+-]digits[.digits][e[+-]digits]
 * (".5" and "5." too), nothing else. */
bool mt_decimal_text(const char *text);

#endif
