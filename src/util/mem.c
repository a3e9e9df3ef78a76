/* Allocation helpers: try variants return NULL, or_die variants abort. */
#include "util/mem.h"

#include <stdlib.h>
#include <string.h>

#include "util/error.h"
#include "util/fault.h"

void *mt_malloc_try(size_t n) { return mt_fault_hit(MT_FAULT_ALLOC) ? NULL : malloc(n ? n : 1); }

void *mt_malloc_or_die(size_t n) {
    void *p = mt_malloc_try(n);
    if (!p) MT_DIE("out of memory allocating %zu bytes", n);
    return p;
}

void *mt_calloc_or_die(size_t count, size_t size) {
    void *p = calloc(count ? count : 1, size ? size : 1);
    if (!p) MT_DIE("out of memory allocating %zu x %zu bytes", count, size);
    return p;
}

void *mt_realloc_or_die(void *p, size_t n) {
    void *q = realloc(p, n ? n : 1);
    if (!q) MT_DIE("out of memory reallocating to %zu bytes", n);
    return q;
}

void *mt_aligned_alloc_try(size_t align, size_t n) {
    void *p = NULL;
    if (mt_fault_hit(MT_FAULT_ALLOC)) return NULL;
    if (posix_memalign(&p, align, n ? mt_round_up(n, align) : align) != 0) return NULL;
    return p;
}

void *mt_aligned_alloc_or_die(size_t align, size_t n) {
    void *p = mt_aligned_alloc_try(align, n);
    if (!p) MT_DIE("out of memory allocating %zu bytes aligned to %zu", n, align);
    return p;
}

char *mt_strdup_or_die(const char *s) {
    size_t n = strlen(s) + 1;
    char *p = mt_malloc_or_die(n);
    memcpy(p, s, n);
    return p;
}
