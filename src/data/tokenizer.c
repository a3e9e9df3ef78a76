/* The encoding pipeline (opening and queries: tokenizer_open.c).
 *
 * encode: split the text on added tokens that match raw text; normalize each
 * remaining piece; split it on added tokens that match normalized text; cut
 * the rest into words with the Split regexes (PCRE2, JIT); BPE each word.
 *
 * BPE follows HF `tokenizers` exactly: the word starts as one symbol per
 * char (per byte for byte-level), then the adjacent pair of lowest merge
 * rank (leftmost on ties) is merged until no pair has a rank. A min-heap of
 * (rank, position) with lazy deletion makes that O(n log n). Llama-2 has no
 * pre-tokenizer, so a whole document is one word; when the vocab allows it
 * (checked at load) such a word is cut before each "▁" that follows another
 * char, with identical ids. Each encoder keeps a cache of recent words (or
 * chunks) -> ids, which is what makes encoding fast. */
#include "data/tokenizer_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "util/mem.h"

/* ---- id buffers ---- */

void mt_tok_ids_free(mt_tok_ids *v) {
    free(v->ids);
    memset(v, 0, sizeof *v);
}

static void ids_reserve(mt_tok_ids *v, size_t extra) {
    size_t need;
    MT_ASSERT(mt_add_size(v->n, extra, &need));
    if (need <= v->cap) return;
    size_t cap = v->cap ? v->cap : 64;
    while (cap < need) cap *= 2;
    v->ids = mt_realloc_or_die(v->ids, cap * sizeof *v->ids);
    v->cap = cap;
}

static inline void ids_push(mt_tok_ids *v, int32_t id) {
    if (v->n == v->cap) ids_reserve(v, 1);
    v->ids[v->n++] = id;
}

static void ids_append(mt_tok_ids *v, const int32_t *ids, size_t n) {
    if (n == 0) return;  // ids may be NULL then
    ids_reserve(v, n);
    memcpy(v->ids + v->n, ids, n * sizeof *ids);
    v->n += n;
}

/* ---- per-thread encoder ---- */

/* The cache starts small (a one-shot encoder clears it once) and doubles
 * when full up to CACHE_MAX_SLOTS, then starts over. Llama-2 chunks keep
 * punctuation ("▁word,"), so brown.jsonl has ~100k distinct ones: 2^14 slots
 * thrashed, 2^17 (about 7 MB per encoder at most) keep most of them. */
#define CACHE_MIN_SLOTS (1u << 14)
#define CACHE_MAX_SLOTS (1u << 17)
#define CACHE_MAX_KEY 64      // longer words are rare and not worth caching
#define CACHE_KEY_PER_SLOT 16 // key bytes and ids per slot: ample for words
#define CACHE_IDS_PER_SLOT 4  // of a few bytes and tokens

typedef struct cache_slot {
    uint64_t hash;
    uint32_t key_off, ids_off;  // ids_off == UINT32_MAX: empty
    uint16_t key_len, n_ids;
} cache_slot;

struct mt_tok_encoder {
    const mt_tokenizer *tok;
    pcre2_match_data *md;
    pcre2_match_context *mctx;
    pcre2_jit_stack *jit;
    size_t window0;  // the first window of a regex match (split_words)
    char *norm[2];  // ping-pong buffers for normalizers
    size_t norm_cap[2];
    int32_t *sym_id, *sym_prev, *sym_next;  // (sym_cap) BPE symbols as a linked list
    size_t sym_cap;
    uint64_t *heap;  // (heap_cap) (rank << 32 | position), min at heap[0]
    size_t heap_cap;
    cache_slot *cache;  // (cache_slots), a power of two
    size_t cache_slots, cache_n;
    char *cache_keys;  // (cache_slots * CACHE_KEY_PER_SLOT)
    size_t cache_keys_len;
    int32_t *cache_ids;  // (cache_slots * CACHE_IDS_PER_SLOT)
    size_t cache_ids_len;
};

static void cache_clear(mt_tok_encoder *e) {
    for (size_t i = 0; i < e->cache_slots; i++) e->cache[i].ids_off = UINT32_MAX;
    e->cache_n = e->cache_keys_len = e->cache_ids_len = 0;
}

/* Sizes the cache for slots entries and empties it. */
static void cache_alloc(mt_tok_encoder *e, size_t slots) {
    e->cache_slots = slots;
    e->cache = mt_realloc_or_die(e->cache, slots * sizeof *e->cache);
    e->cache_keys = mt_realloc_or_die(e->cache_keys, slots * CACHE_KEY_PER_SLOT);
    e->cache_ids = mt_realloc_or_die(e->cache_ids, slots * CACHE_IDS_PER_SLOT * sizeof *e->cache_ids);
    cache_clear(e);
}

static size_t cache_free_slot(const mt_tok_encoder *e, uint64_t h) {
    size_t mask = e->cache_slots - 1, i = h & mask;
    while (e->cache[i].ids_off != UINT32_MAX) i = (i + 1) & mask;
    return i;
}

/* Doubles the table; keys and ids keep their offsets in the grown arenas. */
static void cache_grow(mt_tok_encoder *e) {
    cache_slot *old = e->cache;
    size_t n_old = e->cache_slots, n = e->cache_n, keys = e->cache_keys_len, ids = e->cache_ids_len;
    e->cache = NULL;
    cache_alloc(e, n_old * 2);
    for (size_t i = 0; i < n_old; i++)
        if (old[i].ids_off != UINT32_MAX) e->cache[cache_free_slot(e, old[i].hash)] = old[i];
    free(old);
    e->cache_n = n;
    e->cache_keys_len = keys;
    e->cache_ids_len = ids;
}

mt_tok_encoder *mt_tok_encoder_new(const mt_tokenizer *tok) {
    mt_tok_encoder *e = mt_calloc_or_die(1, sizeof *e);
    e->tok = tok;
    if (tok->is_bytes) return e;
    e->md = pcre2_match_data_create(1, NULL);
    e->mctx = pcre2_match_context_create(NULL);
    e->jit = pcre2_jit_stack_create(32 * 1024, 1024 * 1024, NULL);
    if (!e->md || !e->mctx || !e->jit) MT_DIE("out of memory creating PCRE2 match state");
    pcre2_jit_stack_assign(e->mctx, NULL, e->jit);
    e->window0 = 256;
    cache_alloc(e, CACHE_MIN_SLOTS);
    return e;
}

void mt_tok_encoder_set_window(mt_tok_encoder *e, size_t bytes) {
    MT_ASSERT(bytes >= 4);  // a window holds a whole UTF-8 character
    e->window0 = bytes;
}

void mt_tok_encoder_free(mt_tok_encoder *e) {
    if (!e) return;
    pcre2_match_data_free(e->md);
    pcre2_match_context_free(e->mctx);
    pcre2_jit_stack_free(e->jit);
    free(e->norm[0]);
    free(e->norm[1]);
    free(e->sym_id);
    free(e->sym_prev);
    free(e->sym_next);
    free(e->heap);
    free(e->cache);
    free(e->cache_keys);
    free(e->cache_ids);
    free(e);
}

static const cache_slot *cache_get(const mt_tok_encoder *e, const char *w, size_t len, uint64_t h) {
    size_t mask = e->cache_slots - 1;
    for (size_t i = h & mask;; i = (i + 1) & mask) {
        const cache_slot *s = &e->cache[i];
        if (s->ids_off == UINT32_MAX) return NULL;
        if (s->hash == h && s->key_len == len && memcmp(e->cache_keys + s->key_off, w, len) == 0) return s;
    }
}

static void cache_put(mt_tok_encoder *e, const char *w, size_t len, uint64_t h, const int32_t *ids, size_t n) {
    if (e->cache_n * 2 >= e->cache_slots || e->cache_keys_len + len > e->cache_slots * CACHE_KEY_PER_SLOT ||
        e->cache_ids_len + n > e->cache_slots * CACHE_IDS_PER_SLOT) {
        if (e->cache_slots < CACHE_MAX_SLOTS)
            cache_grow(e);
        else
            cache_clear(e);  // full: start over rather than track recency
    }
    size_t i = cache_free_slot(e, h);
    memcpy(e->cache_keys + e->cache_keys_len, w, len);
    memcpy(e->cache_ids + e->cache_ids_len, ids, n * sizeof *ids);
    e->cache[i] = (cache_slot){.hash = h, .key_off = (uint32_t)e->cache_keys_len,
                               .ids_off = (uint32_t)e->cache_ids_len,
                               .key_len = (uint16_t)len, .n_ids = (uint16_t)n};
    e->cache_keys_len += len;
    e->cache_ids_len += n;
    e->cache_n++;
}

/* ---- BPE ---- */

static void reserve_symbols(mt_tok_encoder *e, size_t n) {
    if (n <= e->sym_cap) return;
    size_t cap = n < 256 ? 256 : n;
    e->sym_id = mt_realloc_or_die(e->sym_id, cap * sizeof *e->sym_id);
    e->sym_prev = mt_realloc_or_die(e->sym_prev, cap * sizeof *e->sym_prev);
    e->sym_next = mt_realloc_or_die(e->sym_next, cap * sizeof *e->sym_next);
    size_t hcap;
    MT_ASSERT(mt_mul_size(cap, 3, &hcap));  // n-1 initial pairs + 2 per merge
    e->heap = mt_realloc_or_die(e->heap, hcap * sizeof *e->heap);
    e->sym_cap = cap;
    e->heap_cap = hcap;
}

static void heap_push(uint64_t *h, size_t *n, uint64_t v) {
    size_t i = (*n)++;
    while (i > 0 && h[(i - 1) / 2] > v) {
        h[i] = h[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    h[i] = v;
}

static uint64_t heap_pop(uint64_t *h, size_t *n) {
    uint64_t top = h[0], v = h[--(*n)];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= *n) break;
        if (c + 1 < *n && h[c + 1] < h[c]) c++;
        if (h[c] >= v) break;
        h[i] = h[c];
        i = c;
    }
    h[i] = v;
    return top;
}

/* Initial symbols of a word, as HF BPE::merge_word: each char's id, else its
 * <0xNN> bytes (byte_fallback), else <unk> (consecutive ones fused when
 * fuse_unk; a pending <unk> is emitted before the next known char). */
static size_t initial_symbols(mt_tok_encoder *e, const char *w, size_t len) {
    const mt_tokenizer *tok = e->tok;
    int32_t *sym = e->sym_id;
    size_t n = 0;
    bool unk_pending = false;
    for (size_t i = 0; i < len;) {
        uint32_t cp;
        size_t k = tok->byte_level ? 1 : mt_tok_utf8_next(w + i, len - i, &cp);
        int32_t id = tok->byte_level ? tok->byte_ids[(unsigned char)w[i]]
                                     : mt_tok_strmap_get(&tok->vocab, w + i, k);
        if (id >= 0) {
            if (unk_pending) sym[n++] = tok->unk_id;
            unk_pending = false;
            sym[n++] = id;
        } else {
            bool all = tok->byte_fallback;
            for (size_t j = 0; all && j < k; j++) all = tok->fallback_ids[(unsigned char)w[i + j]] >= 0;
            if (all) {
                for (size_t j = 0; j < k; j++) sym[n++] = tok->fallback_ids[(unsigned char)w[i + j]];
            } else if (tok->unk_id >= 0) {
                if (unk_pending && !tok->fuse_unk) sym[n++] = tok->unk_id;
                unk_pending = true;
            }  // no unk token: HF drops the char
        }
        i += k;
    }
    if (unk_pending) sym[n++] = tok->unk_id;
    return n;
}

static void push_pair(mt_tok_encoder *e, size_t *nh, int32_t pos) {
    const mt_tok_mergeslot *m = mt_tok_mergemap_get(&e->tok->merges, e->sym_id[pos], e->sym_id[e->sym_next[pos]]);
    if (m) heap_push(e->heap, nh, (uint64_t)m->rank << 32 | (uint32_t)pos);
}

/* Merges the n initial symbols in place: a linked list from symbol 0. */
static void merge_symbols(mt_tok_encoder *e, size_t n) {
    int32_t *id = e->sym_id, *prev = e->sym_prev, *next = e->sym_next;
    for (size_t i = 0; i < n; i++) {
        prev[i] = (int32_t)i - 1;
        next[i] = i + 1 < n ? (int32_t)i + 1 : -1;
    }
    size_t nh = 0;
    for (size_t i = 0; i + 1 < n; i++) push_pair(e, &nh, (int32_t)i);
    while (nh > 0) {
        uint64_t top = heap_pop(e->heap, &nh);
        int32_t pos = (int32_t)(uint32_t)top, nx = next[pos];
        if (id[pos] < 0 || nx < 0) continue;  // merged away, or now last
        const mt_tok_mergeslot *m = mt_tok_mergemap_get(&e->tok->merges, id[pos], id[nx]);
        if (!m || m->rank != (uint32_t)(top >> 32)) continue;  // stale entry
        id[pos] = m->new_id;
        id[nx] = -1;
        next[pos] = next[nx];
        if (next[pos] >= 0) prev[next[pos]] = pos;
        if (prev[pos] >= 0) push_pair(e, &nh, prev[pos]);
        if (next[pos] >= 0) push_pair(e, &nh, pos);
    }
}

static void bpe_word(mt_tok_encoder *e, const char *w, size_t len, mt_tok_ids *out) {
    const mt_tokenizer *tok = e->tok;
    if (tok->ignore_merges) {  // a word that is a token is emitted whole
        int32_t id = mt_tok_strmap_get(&tok->vocab, w, len);
        if (id >= 0) { ids_push(out, id); return; }
    }
    uint64_t h = 0;
    if (len <= CACHE_MAX_KEY) {
        h = mt_tok_hash(w, len);
        const cache_slot *s = cache_get(e, w, len, h);
        if (s) { ids_append(out, e->cache_ids + s->ids_off, s->n_ids); return; }
    }
    MT_ASSERT(len < INT32_MAX);
    reserve_symbols(e, len + 1);  // at most one symbol per byte
    size_t n = initial_symbols(e, w, len);
    merge_symbols(e, n);
    size_t first = out->n;
    for (int32_t i = n ? 0 : -1; i >= 0; i = e->sym_next[i]) ids_push(out, e->sym_id[i]);  // symbol 0 stays first
    if (len <= CACHE_MAX_KEY && n > 0) cache_put(e, w, len, h, out->ids + first, out->n - first);
}

/* With tok->sp_chunks, cuts a word before each "▁" that follows another
 * char and encodes the chunks alone: the same ids (mt_tok_sp_chunks_exact
 * says why), but short chunks hit the cache and the merge heap stays small.
 * Without it a SentencePiece-style document is one word. */
static void bpe_chunks(mt_tok_encoder *e, const char *w, size_t len, mt_tok_ids *out) {
    if (!e->tok->sp_chunks) {
        bpe_word(e, w, len, out);
        return;
    }
    const size_t k = MT_TOK_SP_MARK_LEN;
    size_t start = 0, i = 1;
    while (i + k <= len) {
        const char *m = memchr(w + i, MT_TOK_SP_MARK[0], len - k + 1 - i);
        if (!m) break;
        i = (size_t)(m - w);
        if (memcmp(m, MT_TOK_SP_MARK, k) != 0) {
            i++;
            continue;
        }
        bool after_mark = i >= k && memcmp(m - k, MT_TOK_SP_MARK, k) == 0;
        if (!after_mark) {
            bpe_word(e, w + start, i - start, out);
            start = i;
        }
        i += k;
    }
    bpe_word(e, w + start, len - start, out);
}

/* ---- pre-tokenization ---- */

static int split_words(mt_tok_encoder *e, size_t level, const char *s, size_t len, mt_tok_ids *out,
                       mt_error *err);

static inline int word_or_split(mt_tok_encoder *e, size_t level, const char *s, size_t len,
                                mt_tok_ids *out, mt_error *err) {
    if (len == 0) return 0;
    if (level == e->tok->n_splits) {
        bpe_chunks(e, s, len, out);
        return 0;
    }
    return split_words(e, level, s, len, out, err);
}

/* A regex's match may depend on text far ahead of it: `[a-z]*[0-9]|.`
 * looks for a digit to the end of a run of letters at every position, so a
 * long run costs its length squared (200 KB: 21 s). Each match is looked
 * for in a window of the text ahead, grown by doubling while the matcher
 * reached its end (PCRE2_PARTIAL_HARD: it says so rather than take the
 * window's end for the text's), so the matches are those of the whole text;
 * the bytes of the grown windows (from e->window0, 256 bytes) are counted
 * per piece, and a piece whose
 * count passes LOOKAHEAD_BUDGET is refused. Real pre-tokenizers look a few
 * bytes ahead (a long run of spaces or letters once): their count stays a
 * small multiple of the piece. */
#define LOOKAHEAD_BUDGET(len) (64 * (uint64_t)(len) + ((uint64_t)64 << 20))

/* The start of the UTF-8 character holding byte i of s (a window never
 * ends inside a character). */
static size_t char_start(const char *s, size_t i) {
    while (i > 0 && ((unsigned char)s[i] & 0xC0) == 0x80) i--;
    return i;
}

/* The first match of re in s[pos..len) (lookbehind may read before pos) in
 * *st, *en: 1; none: 0; -1 with err. *ahead counts the grown windows. */
static int next_match(mt_tok_encoder *e, size_t level, const char *s, size_t len, size_t pos,
                      size_t *st, size_t *en, uint64_t *ahead, mt_error *err) {
    const pcre2_code *re = e->tok->splits[level];
    size_t w = e->window0;
    while (pos <= len) {
        size_t end = len - pos > w ? char_start(s, pos + w) : len;
        bool cut = end < len;
        int rc = pcre2_match(re, (PCRE2_SPTR)s, end, pos,
                             PCRE2_NO_UTF_CHECK | (cut ? PCRE2_PARTIAL_HARD : 0), e->md, e->mctx);
        if (rc == PCRE2_ERROR_NOMATCH && !cut) return 0;
        if (rc == PCRE2_ERROR_NOMATCH) { /* none starts before the window's end */
            pos = end;
            w = e->window0;
            continue;
        }
        if (rc >= 0) {
            const PCRE2_SIZE *ov = pcre2_get_ovector_pointer(e->md);
            if (!cut || ov[0] < end) { /* at the window's end it might have been longer */
                *st = ov[0], *en = ov[1];
                return 1;
            }
        } else if (rc != PCRE2_ERROR_PARTIAL) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(rc, msg, sizeof msg);
            return mt_errorf(err, "pre-tokenizer regex failed on a %zu-byte piece at byte %zu: %s",
                             len, pos + 1, (char *)msg);
        }
        w *= 2;
        *ahead += w;
        if (*ahead > LOOKAHEAD_BUDGET(len))
            return mt_errorf(err, "the tokenizer's pre-tokenizer regex (Split %zu) takes "
                             "quadratic time on this text: by byte %zu of %zu its matches had "
                             "looked %.1f MB ahead, more than %.1f MB for a text of this length "
                             "(a regex that scans to the end of a long run at each position); "
                             "split the text into shorter lines, or fix the regex",
                             level, pos + 1, len,
                             (double)*ahead / 1e6, (double)LOOKAHEAD_BUDGET(len) / 1e6);
    }
    return 0;
}

/* Split(regex, Isolated): matches and the gaps between them are words. */
static int split_words(mt_tok_encoder *e, size_t level, const char *s, size_t len, mt_tok_ids *out,
                       mt_error *err) {
    size_t pos = 0, prev = 0, st = 0, en = 0;
    uint64_t ahead = 0;
    int found = 0;
    while (pos <= len && (found = next_match(e, level, s, len, pos, &st, &en, &ahead, err)) == 1) {
        if (word_or_split(e, level + 1, s + prev, st - prev, out, err)) return -1;
        if (word_or_split(e, level + 1, s + st, en - st, out, err)) return -1;
        prev = en;
        if (en > st) {
            pos = en;
        } else {  // empty match: retry one char further, as find_iter does
            uint32_t cp;
            if (en >= len) break;
            pos = en + mt_tok_utf8_next(s + en, len - en, &cp);
        }
    }
    if (found < 0) return -1;
    return word_or_split(e, level + 1, s + prev, len - prev, out, err);
}

/* ---- normalization ---- */

static char *norm_buf(mt_tok_encoder *e, int k, size_t need) {
    if (need > e->norm_cap[k]) {
        e->norm_cap[k] = need * 2;
        e->norm[k] = mt_realloc_or_die(e->norm[k], e->norm_cap[k]);
    }
    return e->norm[k];
}

static bool has_non_ascii(const char *s, size_t len) {
    for (size_t i = 0; i < len; i++)
        if ((unsigned char)s[i] >= 0x80) return true;
    return false;
}

/* Applies the normalizers; the result lives in an encoder buffer (or is s). */
static int normalize(mt_tok_encoder *e, const char **s, size_t *len, mt_error *err) {
    const mt_tokenizer *tok = e->tok;
    for (size_t k = 0; k < tok->n_norms; k++) {
        const mt_tok_norm *nm = &tok->norms[k];
        int which = *s == e->norm[0] ? 1 : 0;  // write into the buffer not being read
        const char *in = *s;
        size_t n = *len;
        if (nm->kind == MT_NORM_NFC) {
            if (!has_non_ascii(in, n)) continue;  // ASCII is already NFC
            utf8proc_uint8_t *dst = NULL;
            utf8proc_ssize_t m = utf8proc_map((const utf8proc_uint8_t *)in, (utf8proc_ssize_t)n, &dst,
                                              UTF8PROC_STABLE | UTF8PROC_COMPOSE);
            if (m < 0) return mt_errorf(err, "NFC normalization failed: %s", utf8proc_errmsg(m));
            char *b = norm_buf(e, which, (size_t)m + 1);
            memcpy(b, dst, (size_t)m);
            free(dst);
            *s = b;
            *len = (size_t)m;
        } else if (nm->kind == MT_NORM_PREPEND) {
            if (n == 0) continue;  // HF prepends only to non-empty text
            char *b = norm_buf(e, which, nm->alen + n);
            memcpy(b, nm->a, nm->alen);
            memcpy(b + nm->alen, in, n);
            *s = b;
            *len = nm->alen + n;
        } else {  // MT_NORM_REPLACE, non-overlapping from the left
            size_t worst = n / nm->alen * nm->blen + n + 1;
            char *b = norm_buf(e, which, worst), *o = b;
            for (size_t i = 0; i < n;) {
                if (i + nm->alen <= n && memcmp(in + i, nm->a, nm->alen) == 0) {
                    memcpy(o, nm->b, nm->blen);
                    o += nm->blen;
                    i += nm->alen;
                } else {
                    *o++ = in[i++];
                }
            }
            *s = b;
            *len = (size_t)(o - b);
        }
    }
    return 0;
}

/* ---- added tokens ---- */

/* Leftmost-longest match of set in s[from..len): true with [*st, *en), *id. */
static bool find_added(const mt_tok_addedset *set, const char *s, size_t len, size_t from,
                       size_t *st, size_t *en, int32_t *id) {
    if (set->n == 0) return false;
    for (size_t i = from; i < len; i++) {
        unsigned c = (unsigned char)s[i];
        for (uint32_t k = set->bucket[c]; k < set->bucket[c + 1]; k++) {
            const mt_tok_added *t = &set->tok[k];
            if (t->len <= len - i && memcmp(s + i, t->content, t->len) == 0) {
                *st = i;
                *en = i + t->len;
                *id = t->id;
                return true;
            }
        }
    }
    return false;
}

bool mt_tokenizer_next_added(const mt_tokenizer *tok, const char *s, size_t len, size_t from,
                             size_t *st, size_t *en, int32_t *id) {
    return !tok->is_bytes && find_added(&tok->added_raw, s, len, from, st, en, id);
}

/* A piece between raw-matched added tokens. */
static int encode_piece(mt_tok_encoder *e, const char *s, size_t len, mt_tok_ids *out, mt_error *err) {
    if (len == 0) return 0;
    if (normalize(e, &s, &len, err)) return -1;
    size_t pos = 0, st, en;
    int32_t id;
    while (find_added(&e->tok->added_norm, s, len, pos, &st, &en, &id)) {
        if (word_or_split(e, 0, s + pos, st - pos, out, err)) return -1;
        ids_push(out, id);
        pos = en;
    }
    return word_or_split(e, 0, s + pos, len - pos, out, err);
}

int mt_tok_encode(mt_tok_encoder *e, const char *text, size_t len, bool add_special, mt_tok_ids *out,
                  mt_error *err) {
    const mt_tokenizer *tok = e->tok;
    if (tok->is_bytes) {
        ids_reserve(out, len + 1);
        if (add_special) out->ids[out->n++] = 256;
        for (size_t i = 0; i < len; i++) out->ids[out->n++] = (unsigned char)text[i];
        return 0;
    }
    size_t bad = mt_tok_utf8_invalid_at(text, len);
    if (bad < len)
        return mt_errorf(err, "text is not valid UTF-8 at byte %zu of %zu; clean or re-encode the input",
                         bad, len);
    if (add_special) ids_append(out, tok->prefix_ids, tok->n_prefix);
    size_t pos = 0, st, en;
    int32_t id;
    while (find_added(&tok->added_raw, text, len, pos, &st, &en, &id)) {
        if (encode_piece(e, text + pos, st - pos, out, err)) return -1;
        ids_push(out, id);
        pos = en;
    }
    if (encode_piece(e, text + pos, len - pos, out, err)) return -1;
    if (add_special) ids_append(out, tok->suffix_ids, tok->n_suffix);
    return 0;
}

int mt_tokenizer_encode(const mt_tokenizer *tok, const char *text, size_t len, bool add_special,
                        int32_t **ids, size_t *n, mt_error *err) {
    mt_tok_encoder *e = mt_tok_encoder_new(tok);
    mt_tok_ids v = {0};
    int rc = mt_tok_encode(e, text, len, add_special, &v, err);
    mt_tok_encoder_free(e);
    if (rc) {
        mt_tok_ids_free(&v);
        return -1;
    }
    *ids = v.ids ? v.ids : mt_malloc_or_die(sizeof **ids);
    *n = v.n;
    return 0;
}
