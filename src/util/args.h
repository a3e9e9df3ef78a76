/* Numbers on the command line: the whole argument must be the number. */
#ifndef MT_UTIL_ARGS_H
#define MT_UTIL_ARGS_H

/* The integer (or number) in text; sets *bad (left alone otherwise) when
 * text is empty, has trailing characters or is out of range (a number: is
 * not finite; one too small to represent reads as 0). */
long long mt_arg_ll(const char *text, int *bad);
double mt_arg_d(const char *text, int *bad);

#endif
