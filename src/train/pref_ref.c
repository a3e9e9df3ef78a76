/* The reference log-probabilities file (pref_ref.h): the pass that writes
 * it, resumable a batch at a time, and its checked reading. */
#include "train/pref_ref.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <xxhash.h>

#include "engine/step.h"
#include "util/mem.h"

#define MAGIC "MTREFLP1"
#define END "MTREFEND"
#define HEADER_BYTES 32

typedef struct ref_header {
    char magic[8];
    uint64_t pairs, data_sum, model_sum;
} ref_header;

uint64_t mt_pref_ref_model_sum(const float *w, size_t n) { return XXH3_64bits(w, n * sizeof *w); }

static ref_header header_of(const mt_pref_data *d, uint64_t model_sum) {
    ref_header h = {.pairs = (uint64_t)d->n_pairs, .data_sum = d->checksum,
                    .model_sum = model_sum};
    memcpy(h.magic, MAGIC, 8);
    return h;
}

/* Whether a file's header is of this data (and, model_sum not 0, model). */
static int header_matches(const ref_header *h, const ref_header *want) {
    return !memcmp(h->magic, MAGIC, 8) && h->pairs == want->pairs &&
           h->data_sum == want->data_sum && (!want->model_sum || h->model_sum == want->model_sum);
}

int mt_pref_ref_load(mt_pref_data *d, const char *path, uint64_t model_sum, mt_error *err) {
    FILE *f = fopen(path, "rb");
    if (!f && errno == ENOENT) return 1;
    if (!f) return mt_errorf(err, "%s: cannot open: %s", path, strerror(errno));
    size_t n = 2 * (size_t)d->n_pairs, bytes = HEADER_BYTES + n * sizeof(double) + 16;
    char *buf = mt_malloc_or_die(bytes + 1);
    size_t got = fread(buf, 1, bytes + 1, f);
    fclose(f);
    ref_header h, want = header_of(d, model_sum);
    memcpy(&h, buf, got >= HEADER_BYTES ? HEADER_BYTES : 0);
    uint64_t sum;
    memcpy(&sum, buf + bytes - 16, got == bytes ? 8 : 0);
    int rc = 0;
    if (got < HEADER_BYTES || memcmp(buf, MAGIC, 8))
        rc = mt_errorf(err, "%s: not a reference log-probabilities file", path);
    else if (!header_matches(&h, &want))
        rc = mt_errorf(err, "%s: the reference log-probabilities of other %s; delete it to "
                       "compute them again", path,
                       h.data_sum != want.data_sum || h.pairs != want.pairs
                           ? "data (its pairs, tokenizer, chat template or seq_len differ)"
                           : "reference weights");
    else if (got != bytes || memcmp(buf + bytes - 8, END, 8) ||
             sum != XXH3_64bits(buf, bytes - 16))
        rc = mt_errorf(err, "%s: damaged (%zu bytes, or a checksum that does not match); "
                       "delete it to compute the reference log-probabilities again", path, got);
    if (rc == 0) {
        free(d->ref);
        d->ref = mt_malloc_or_die(n * sizeof *d->ref);
        memcpy(d->ref, buf + HEADER_BYTES, n * sizeof *d->ref);
    }
    free(buf);
    return rc;
}

/* The partial file: opened for appending after the pairs already in it
 * (when its header is this pass's), else started afresh. */
static FILE *open_partial(const char *part, const ref_header *want, double *ref,
                          int64_t *done, mt_error *err) {
    *done = 0;
    FILE *f = fopen(part, "rb");
    if (f) {
        ref_header h;
        if (fread(&h, 1, HEADER_BYTES, f) == HEADER_BYTES && header_matches(&h, want)) {
            double two[2];
            while (*done < (int64_t)want->pairs && fread(two, sizeof two, 1, f) == 1)
                ref[2 * *done] = two[0], ref[2 * *done + 1] = two[1], ++*done;
        }
        fclose(f);
    }
    f = fopen(part, *done ? "r+b" : "wb");
    if (!f) return mt_errorf(err, "%s: cannot write: %s", part, strerror(errno)), NULL;
    if (*done ? fseek(f, HEADER_BYTES + *done * 2 * (long)sizeof(double), SEEK_SET)
              : fwrite(want, HEADER_BYTES, 1, f) != 1) {
        fclose(f);
        return mt_errorf(err, "%s: cannot write: %s", part, strerror(errno)), NULL;
    }
    return f;
}

/* The log-probabilities of pairs [d->next, ...) of one step's batch into
 * ref, in file order (the walk over w takes them in that order): each rank
 * those of its micro-batches, the others' added over the ranks (r; each
 * value comes from one rank, so the sum is exact). */
static int pass_batch(mt_pref_data *w, mt_backend *be, int n_layers, int M,
                      const mt_pref_ranks *r, int32_t *buf, float *logp, mt_pref_pair *pairs,
                      int64_t *ids, double *ref, int64_t *n, mt_error *err) {
    int64_t N = w->o.B * w->o.T, all = (int64_t)M * N, done = w->next;
    int32_t *tok = buf, *tgt = buf + all, *pos = buf + 2 * all;
    if (mt_pref_data_next(w, M, tok, tgt, pos, pairs, n, ids)) return 1;
    size_t skip = (size_t)r->mb_first * (size_t)N;
    mt_batch b = {.M = r->M, .B = w->o.B, .T = w->o.T, .tokens = tok + skip,
                  .targets = tgt + skip, .pos = pos + skip};
    if (mt_step_logp(be, n_layers, &b, logp, err)) return -1;
    double *batch = ref + 2 * done;
    memset(batch, 0, 2 * (size_t)*n * sizeof *batch);
    for (int64_t i = 0; i < *n; i++) {
        int mb = pairs[i].chosen.mb - r->mb_first;
        if (mb < 0 || mb >= r->M) continue;
        size_t off = (size_t)mb * (size_t)N;
        /* file order: the batch's pairs are done..done+n-1 */
        batch[2 * (ids[i] - done)] = mt_pref_span_logp(logp + off, b.targets + off,
                                                       pairs[i].chosen);
        batch[2 * (ids[i] - done) + 1] = mt_pref_span_logp(logp + off, b.targets + off,
                                                           pairs[i].rejected);
    }
    return r->sum ? r->sum(r->ctx, batch, (int)(2 * *n), err) : 0;
}

/* Closes the partial file with its checksum and end mark, and renames it
 * into place. */
static int finish(FILE *f, const char *part, const char *path, const ref_header *h,
                  const double *ref, mt_error *err) {
    XXH3_state_t *s = XXH3_createState();
    XXH3_64bits_reset(s);
    XXH3_64bits_update(s, h, HEADER_BYTES);
    XXH3_64bits_update(s, ref, 2 * h->pairs * sizeof *ref);
    uint64_t sum = XXH3_64bits_digest(s);
    XXH3_freeState(s);
    int bad = fwrite(&sum, 8, 1, f) != 1 || fwrite(END, 8, 1, f) != 1 || fflush(f) ||
              fsync(fileno(f));
    bad |= fclose(f) != 0;
    if (bad || rename(part, path))
        return mt_errorf(err, "%s: cannot write: %s (disk full?)", path, strerror(errno));
    return 0;
}

/* Every rank learns what rank 0's partial file held: done, and ref's
 * first 2 * done values. */
static int share_resumed(const mt_pref_ranks *r, double *ref, int64_t pairs, int64_t *done,
                         mt_error *err) {
    if (!r->sum) return 0;
    double *x = mt_calloc_or_die(2 * (size_t)pairs + 1, sizeof *x);
    if (r->lead) {
        x[0] = (double)*done;
        memcpy(x + 1, ref, 2 * (size_t)*done * sizeof *ref);
    }
    int rc = r->sum(r->ctx, x, (int)(2 * pairs + 1), err);
    if (rc == 0) {
        *done = (int64_t)x[0];
        memcpy(ref, x + 1, 2 * (size_t)*done * sizeof *ref);
    }
    free(x);
    return rc;
}

int mt_pref_ref_compute(mt_pref_data *d, mt_backend *be, int n_layers, int M, const char *path,
                        uint64_t model_sum, int64_t *resumed, mt_error *err) {
    return mt_pref_ref_compute_ranks(d, be, n_layers, M, NULL, path, model_sum, resumed, err);
}

int mt_pref_ref_compute_ranks(mt_pref_data *d, mt_backend *be, int n_layers, int M,
                              const mt_pref_ranks *r, const char *path, uint64_t model_sum,
                              int64_t *resumed, mt_error *err) {
    mt_pref_ranks one = {.mb_first = 0, .M = M, .lead = 1};
    if (!r) r = &one;
    char part[4200];
    snprintf(part, sizeof part, "%s.partial", path ? path : "");
    ref_header h = header_of(d, model_sum);
    double *ref = mt_calloc_or_die(2 * (size_t)d->n_pairs, sizeof *ref);
    FILE *f = NULL;
    *resumed = 0;
    if (path && r->lead && !(f = open_partial(part, &h, ref, resumed, err))) return free(ref), -1;
    if (share_resumed(r, ref, d->n_pairs, resumed, err)) {
        if (f) fclose(f);
        return free(ref), -1;
    }
    /* the pairs in file order, from the first not done */
    mt_pref_data w = *d;
    w.order = mt_malloc_or_die((size_t)d->n_pairs * sizeof *w.order);
    for (int64_t i = 0; i < d->n_pairs; i++) w.order[i] = i;
    w.epoch = 0, w.o.epochs = 1, w.next = *resumed, w.ref = NULL;
    int64_t N = d->o.B * d->o.T, all = (int64_t)M * N, n, done = *resumed;
    int32_t *buf = mt_malloc_or_die(3 * (size_t)all * sizeof *buf);
    float *logp = mt_malloc_or_die((size_t)r->M * (size_t)N * sizeof *logp);
    mt_pref_pair *pairs = mt_malloc_or_die((size_t)(all / 2 + 1) * sizeof *pairs);
    int64_t *ids = mt_malloc_or_die((size_t)(all / 2 + 1) * sizeof *ids);
    int rc;
    while ((rc = pass_batch(&w, be, n_layers, M, r, buf, logp, pairs, ids, ref, &n, err)) == 0) {
        if (f && (fwrite(ref + 2 * done, sizeof *ref, 2 * (size_t)n, f) != 2 * (size_t)n ||
                  fflush(f))) {
            rc = mt_errorf(err, "%s: cannot write: %s (disk full?)", part, strerror(errno));
            break;
        }
        done += n;
    }
    if (rc == 1) rc = f ? finish(f, part, path, &h, ref, err) : 0;
    else if (f) fclose(f);
    free(buf), free(logp), free(pairs), free(ids), free(w.order);
    if (rc) return free(ref), -1;
    free(d->ref);
    d->ref = ref;
    return 0;
}
