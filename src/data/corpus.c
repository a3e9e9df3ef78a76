/* Opening one data source: a file (JSONL tokenized in memory, .mtok mapped,
 * either one possibly compressed) or a directory of shards; see corpus.h. */
#include "data/corpus.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "data/data_file.h"
#include "io/file.h"
#include "util/mem.h"

static int check_vocab(const mt_mtok *m, const char *path, int64_t vocab_size, mt_error *err) {
    if (m->vocab_size <= (uint64_t)vocab_size) return 0;
    for (uint64_t i = 0; i < m->n_tokens; i++)  // find the first id the model lacks
        if (mt_mtok_token(m, i) >= (uint64_t)vocab_size)
            return mt_errorf(err, "%s: token %llu has id %u, outside the model's vocabulary of "
                             "%lld ids: tokenize with the model's own tokenizer", path,
                             (unsigned long long)i, mt_mtok_token(m, i), (long long)vocab_size);
    return 0;
}

/* One file into *m; st gets its format and skipped lines. */
static int open_file(const char *path, const mt_data_opts *o, const mt_tokenizer *tok,
                     int64_t vocab_size, mt_mtok *m, mt_data_stats *st, mt_error *skip_msg,
                     mt_error *err) {
    const char *fmt = o->format && *o->format ? o->format : "auto";
    bool want_mtok = !strcmp(fmt, "tokens"), is_auto = !strcmp(fmt, "auto");
    mt_compression c;
    if (mt_data_file_compression(path, &c, err)) return -1;
    if (is_auto) {  // a .mtok starts with its magic
        char magic[4];
        size_t n;
        if (mt_data_file_head(path, magic, 4, &n, err)) return -1;
        want_mtok = n == 4 && !memcmp(magic, "MTOK", 4);
    }
    if (want_mtok && c == MT_COMPRESS_NONE) {
        if (mt_mtok_open(path, m, err)) return -1;
        st->format = "tokens";
        return check_vocab(m, path, vocab_size, err);
    }
    if (want_mtok) {  // a compressed .mtok is read into memory whole
        char *buf;
        size_t len;
        if (mt_data_file_read(path, &buf, &len, err)) return -1;
        if (mt_mtok_parse(buf, len, path, m, err)) return free(buf), -1;
        m->owned[0] = buf;  // freed with m
        st->format = "tokens";
        return check_vocab(m, path, vocab_size, err);
    }
    if (!tok) return mt_errorf(err, "%s: JSONL data needs a tokenizer", path);
    mt_line_reader *lines = mt_line_reader_open(path, MT_DATA_MAX_LINE, err);
    if (!lines) return -1;
    mt_data_opts fo = *o;
    fo.path = path;
    int rc = mt_jsonl_tokenize(&fo, lines, tok, vocab_size, m, &st->format, &st->chat_template,
                               &st->skipped_lines, skip_msg, err);
    st->bytes = (int64_t)mt_line_reader_bytes(lines);
    mt_line_reader_close(lines);
    return rc;
}

static int cmp_names(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* The data files of directory dir, in byte order of their names. */
int mt_corpus_list_shards(const char *dir, char ***out, size_t *n, int64_t *ignored,
                          mt_error *err) {
    DIR *d = opendir(dir);
    if (!d) return mt_errorf(err, "%s: cannot open the directory: %s", dir, strerror(errno));
    char **names = NULL;
    size_t cap = 0;
    *n = 0;
    int rc = 0;
    struct dirent *e;
    while (!rc && (e = readdir(d))) {
        if (e->d_name[0] == '.') continue;  // ., .., hidden files
        char *p = mt_path_join(dir, e->d_name);
        struct stat st;
        int kind = mt_data_file_is_shard(p, err);
        /* a name of data that cannot be read is an error, not an entry ignored */
        if (kind > 0 && stat(p, &st) != 0)
            kind = mt_errorf(err, "%s: a data file of the directory that cannot be read: %s%s",
                             p, strerror(errno),
                             errno == ENOENT ? " (a link to a file that does not exist?)"
                             : errno == ELOOP ? " (a link that leads back to itself?)" : "");
        else if (kind > 0 && !S_ISREG(st.st_mode))
            kind = mt_errorf(err, "%s: named like a data file of the directory, but %s; "
                             "rename or remove it", p,
                             S_ISDIR(st.st_mode) ? "a directory" : "not a regular file");
        if (kind < 0) rc = -1;
        if (kind <= 0) {
            free(p);
            ++*ignored;
            continue;
        }
        if (*n == cap) names = mt_realloc_or_die(names, (cap = cap ? 2 * cap : 16) * sizeof *names);
        names[(*n)++] = p;
    }
    closedir(d);
    if (!rc && *n == 0)
        rc = mt_errorf(err, "%s: no data files in the directory (%lld other entries): a directory "
                       "of shards holds NAME.jsonl, NAME.jsonl.gz, NAME.jsonl.zst or NAME.mtok "
                       "files; put them there or give one file", dir, (long long)*ignored);
    if (rc) {
        for (size_t i = 0; i < *n; i++) free(names[i]);
        free(names);
        return -1;
    }
    qsort(names, *n, sizeof *names, cmp_names);
    *out = names;
    return 0;
}

/* Adds the stats of a file to the corpus's. */
static void add_stats(mt_corpus *c, const mt_data_stats *f) {
    mt_data_stats *s = &c->stats;
    if (!s->format) s->format = f->format;
    else if (strcmp(s->format, f->format)) s->format = "mixed";
    if (!s->chat_template) s->chat_template = f->chat_template;
    s->skipped_lines += f->skipped_lines;
    s->bytes += f->bytes;
}

int mt_corpus_open(mt_corpus *c, const mt_data_opts *o, const mt_tokenizer *tok,
                   int64_t vocab_size, mt_error *err) {
    memset(c, 0, sizeof *c);
    if (mt_is_dir(o->path)) {
        if (mt_corpus_list_shards(o->path, &c->names, &c->n_parts, &c->ignored, err)) return -1;
    } else {
        c->names = mt_malloc_or_die(sizeof *c->names);
        c->names[0] = mt_strdup_or_die(o->path);
        c->n_parts = 1;
    }
    c->parts = mt_calloc_or_die(c->n_parts, sizeof *c->parts);
    c->first_doc = mt_calloc_or_die(c->n_parts + 1, sizeof *c->first_doc);
    for (size_t i = 0; i < c->n_parts; i++) {
        mt_data_stats st = {0};
        mt_error skip_msg = {{0}};
        if (open_file(c->names[i], o, tok, vocab_size, &c->parts[i], &st, &skip_msg, err))
            return -1;
        if (st.skipped_lines && !c->stats.skipped_lines) c->first_skipped = skip_msg;
        add_stats(c, &st);
        const mt_mtok *p = &c->parts[i];
        if (p->vocab_size != c->parts[0].vocab_size)
            return mt_errorf(err, "%s: tokenized for a vocabulary of %llu ids, %s for %llu: every "
                             "shard of a directory must come from the same tokenizer; "
                             "re-tokenize one of them", c->names[i],
                             (unsigned long long)p->vocab_size, c->names[0],
                             (unsigned long long)c->parts[0].vocab_size);
        c->first_doc[i + 1] = c->first_doc[i] + p->n_docs;
        c->n_tokens += p->n_tokens;
        c->stats.trainable += (int64_t)p->n_trainable;
    }
    c->n_docs = c->first_doc[c->n_parts];
    c->stats.documents = (int64_t)c->n_docs;
    c->stats.tokens = (int64_t)c->n_tokens;
    return 0;
}

void mt_corpus_free(mt_corpus *c) {
    for (size_t i = 0; c->parts && i < c->n_parts; i++) mt_mtok_free(&c->parts[i]);
    for (size_t i = 0; c->names && i < c->n_parts; i++) free(c->names[i]);
    free(c->parts);
    free(c->names);
    free(c->first_doc);
    memset(c, 0, sizeof *c);
}

void mt_corpus_merge(const mt_corpus *c, mt_mtok *out) {
    bool masked = false;
    for (size_t i = 0; i < c->n_parts; i++) masked |= c->parts[i].mask != NULL;
    mt_mtok_alloc(out, c->parts[0].vocab_size, c->n_docs, c->n_tokens, masked);
    uint64_t *offs = (uint64_t *)out->offsets, k = 0, d = 0;
    uint8_t *mask = (uint8_t *)out->mask;
    for (size_t i = 0; i < c->n_parts; i++) {
        const mt_mtok *p = &c->parts[i];
        for (uint64_t j = 0; j < p->n_docs; j++) offs[d++] = k + p->offsets[j];
        for (uint64_t t = 0; t < p->n_tokens; t++, k++) {
            uint32_t id = mt_mtok_token(p, t);
            if (out->token_bytes == 2) ((uint16_t *)out->tokens)[k] = (uint16_t)id;
            else ((uint32_t *)out->tokens)[k] = id;
            if (mask && mt_mtok_trainable(p, t)) mask[k >> 3] |= (uint8_t)(1u << (k & 7));
        }
        out->n_trainable += p->n_trainable;
    }
    offs[d] = k;
}
