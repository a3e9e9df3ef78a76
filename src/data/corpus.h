/* One data source as a corpus of documents: a file (JSONL, plain or
 * compressed, or .mtok), or a directory of such shards taken in the byte
 * order of their names, whose documents follow each other as if the files
 * were concatenated. Each file stays its own part (a .mtok stays mapped);
 * documents are numbered across parts. */
#ifndef MT_DATA_CORPUS_H
#define MT_DATA_CORPUS_H

#include <stdint.h>

#include "data/dataset.h"

typedef struct mt_corpus {
    mt_mtok *parts;        // (n_parts) one per file, in name order
    char **names;          // (n_parts) their paths
    size_t n_parts;
    uint64_t *first_doc;   // (n_parts + 1) number of the first document of each part
    uint64_t n_docs, n_tokens;
    mt_data_stats stats;
    int64_t ignored;       // entries of a directory that are not data files
    mt_error first_skipped;
} mt_corpus;

/* Opens o->path (a file or a directory) as one corpus; o's other fields as
 * for mt_dataset_open. Errors name the file (and line) at fault. */
int mt_corpus_open(mt_corpus *c, const mt_data_opts *o, const mt_tokenizer *tok,
                   int64_t vocab_size, mt_error *err);
void mt_corpus_free(mt_corpus *c);

/* The part holding document d and d's number within it. */
static inline size_t mt_corpus_part_of(const mt_corpus *c, uint64_t d, uint64_t *local) {
    size_t lo = 0, hi = c->n_parts;  // last part with first_doc <= d
    while (hi - lo > 1) {
        size_t mid = (lo + hi) / 2;
        if (c->first_doc[mid] <= d) lo = mid; else hi = mid;
    }
    *local = d - c->first_doc[lo];
    return lo;
}

/* The data files of the directory dir (malloc'd paths in *names, each and
 * the array freed by the caller), in byte order of their names; *ignored
 * counts the other entries. -1 naming dir (or an entry) on failure. */
int mt_corpus_list_shards(const char *dir, char ***names, size_t *n, int64_t *ignored,
                          mt_error *err);

/* All parts as one in-memory corpus (for writing a single .mtok). */
void mt_corpus_merge(const mt_corpus *c, mt_mtok *out);

#endif
