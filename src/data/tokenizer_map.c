/* Open-addressing hash maps for the tokenizer: token bytes -> id (vocab,
 * about 150k keys) and (left id, right id) -> (rank, merged id) (merges).
 * Both are filled once at load and then only read, from many threads. */
#include "data/tokenizer_internal.h"

#include <stdlib.h>
#include <string.h>

#include "util/mem.h"

#define MT_TOK_K1 0x9E3779B97F4A7C15ull
#define MT_TOK_K2 0xC2B2AE3D27D4EB4Full

static inline uint64_t mix64(uint64_t h) {
    h ^= h >> 33;
    h *= MT_TOK_K2;
    h ^= h >> 29;
    return h;
}

/* Eight bytes per multiply: words are short, so this is mostly one step. */
uint64_t mt_tok_hash(const char *s, size_t len) {
    uint64_t h = (uint64_t)len * MT_TOK_K1;
    while (len >= 8) {
        uint64_t w;
        memcpy(&w, s, 8);
        h = (h ^ w) * MT_TOK_K1;
        h = (h << 29) | (h >> 35);
        s += 8;
        len -= 8;
    }
    if (len) {
        uint64_t w = 0;
        memcpy(&w, s, len);
        h = (h ^ w) * MT_TOK_K2;
    }
    return mix64(h);
}

static size_t table_size(size_t expected) {
    size_t cap = 16;
    while (cap < expected * 2) cap *= 2;  // load factor <= 1/2
    return cap;
}

void mt_tok_strmap_init(mt_tok_strmap *m, size_t expected) {
    size_t cap = table_size(expected);
    m->slots = mt_malloc_or_die(cap * sizeof *m->slots);
    for (size_t i = 0; i < cap; i++) m->slots[i].val = -1;
    m->mask = cap - 1;
    m->n = 0;
    m->arena_cap = expected * 8 + 64;
    m->arena = mt_malloc_or_die(m->arena_cap);
    m->arena_len = 0;
}

void mt_tok_strmap_free(mt_tok_strmap *m) {
    free(m->slots);
    free(m->arena);
    memset(m, 0, sizeof *m);
}

static mt_tok_strslot *strmap_find(const mt_tok_strmap *m, const char *key, size_t len,
                                   uint64_t h) {
    for (size_t i = h & m->mask;; i = (i + 1) & m->mask) {
        mt_tok_strslot *s = &m->slots[i];
        if (s->val < 0) return s;
        if (s->hash == h && s->len == len && memcmp(m->arena + s->off, key, len) == 0) return s;
    }
}

void mt_tok_strmap_put(mt_tok_strmap *m, const char *key, size_t len, int32_t val) {
    MT_ASSERT(val >= 0 && len < UINT32_MAX);
    if ((m->n + 1) * 2 > m->mask + 1) {  // grow: rehash into a table twice as big
        mt_tok_strmap old = *m;
        size_t cap = (old.mask + 1) * 2;
        m->slots = mt_malloc_or_die(cap * sizeof *m->slots);
        for (size_t i = 0; i < cap; i++) m->slots[i].val = -1;
        m->mask = cap - 1;
        for (size_t i = 0; i <= old.mask; i++) {
            if (old.slots[i].val < 0) continue;
            *strmap_find(m, m->arena + old.slots[i].off, old.slots[i].len, old.slots[i].hash) =
                old.slots[i];
        }
        free(old.slots);
    }
    uint64_t h = mt_tok_hash(key, len);
    mt_tok_strslot *s = strmap_find(m, key, len, h);
    if (s->val >= 0) {
        s->val = val;
        return;
    }
    while (m->arena_len + len > m->arena_cap) {
        m->arena_cap *= 2;
        m->arena = mt_realloc_or_die(m->arena, m->arena_cap);
    }
    MT_ASSERT(m->arena_len + len < UINT32_MAX);
    memcpy(m->arena + m->arena_len, key, len);
    *s = (mt_tok_strslot){.hash = h, .off = (uint32_t)m->arena_len, .len = (uint32_t)len, .val = val};
    m->arena_len += len;
    m->n++;
}

int32_t mt_tok_strmap_get(const mt_tok_strmap *m, const char *key, size_t len) {
    return strmap_find(m, key, len, mt_tok_hash(key, len))->val;
}

void mt_tok_mergemap_init(mt_tok_mergemap *m, size_t expected) {
    size_t cap = table_size(expected);
    m->slots = mt_malloc_or_die(cap * sizeof *m->slots);
    for (size_t i = 0; i < cap; i++) m->slots[i].key = UINT64_MAX;
    m->mask = cap - 1;
    m->n = 0;
}

void mt_tok_mergemap_free(mt_tok_mergemap *m) {
    free(m->slots);
    memset(m, 0, sizeof *m);
}

static inline uint64_t pair_key(int32_t a, int32_t b) {
    return ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
}

static mt_tok_mergeslot *mergemap_find(const mt_tok_mergemap *m, uint64_t key) {
    for (size_t i = mix64(key * MT_TOK_K1) & m->mask;; i = (i + 1) & m->mask) {
        mt_tok_mergeslot *s = &m->slots[i];
        if (s->key == key || s->key == UINT64_MAX) return s;
    }
}

/* A pair listed twice keeps its last rank, as HF builds its map. */
void mt_tok_mergemap_put(mt_tok_mergemap *m, int32_t a, int32_t b, uint32_t rank, int32_t new_id) {
    MT_ASSERT((m->n + 1) * 2 <= m->mask + 1);  // sized at init from the merge count
    uint64_t key = pair_key(a, b);
    mt_tok_mergeslot *s = mergemap_find(m, key);
    if (s->key == UINT64_MAX) m->n++;
    *s = (mt_tok_mergeslot){.key = key, .rank = rank, .new_id = new_id};
}

const mt_tok_mergeslot *mt_tok_mergemap_get(const mt_tok_mergemap *m, int32_t a, int32_t b) {
    const mt_tok_mergeslot *s = mergemap_find(m, pair_key(a, b));
    return s->key == UINT64_MAX ? NULL : s;
}
