/* Allocation and checked size arithmetic.
 *
 * "try" variants return NULL on failure; "or_die" variants abort with the
 * size asked for. Every size product in megatrain goes through mt_mul_size
 * so that a hostile header or config cannot wrap a size_t. */
#ifndef MT_UTIL_MEM_H
#define MT_UTIL_MEM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* a*b into *out; false on overflow. */
static inline bool mt_mul_size(size_t a, size_t b, size_t *out) {
    return !__builtin_mul_overflow(a, b, out);
}
static inline bool mt_add_size(size_t a, size_t b, size_t *out) {
    return !__builtin_add_overflow(a, b, out);
}
static inline size_t mt_round_up(size_t n, size_t align) {
    return (n + align - 1) / align * align;
}

/* Carves buffers out of one block: the same calls first count (base NULL)
 * and then carve (base set), so the size and the layout cannot disagree.
 * A size that overflows sets overflow and takes nothing. */
typedef struct mt_arena {
    char *base;
    size_t used;
    bool overflow;
} mt_arena;

/* n * elem bytes at the next multiple of align (a power of two); NULL
 * while counting or after an overflow. */
static inline void *mt_arena_take(mt_arena *a, size_t n, size_t elem, size_t align) {
    size_t b, end;
    if (a->overflow || !mt_mul_size(n, elem, &b) || b > SIZE_MAX - align ||
        !mt_add_size(a->used, mt_round_up(b, align), &end)) {
        a->overflow = true;
        return NULL;
    }
    void *p = a->base ? a->base + a->used : NULL;
    a->used = end;
    return p;
}

void *mt_malloc_try(size_t n);
void *mt_malloc_or_die(size_t n);
void *mt_calloc_or_die(size_t count, size_t size);
void *mt_realloc_or_die(void *p, size_t n);
/* Aligned to `align` (a power of two >= sizeof(void*)); free with free(). */
void *mt_aligned_alloc_try(size_t align, size_t n);
void *mt_aligned_alloc_or_die(size_t align, size_t n);
char *mt_strdup_or_die(const char *s);

#endif
