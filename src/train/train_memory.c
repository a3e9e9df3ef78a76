/* Host bytes of a training run from its options, and the refusal of one
 * that does not fit in RAM. */
#include "train/train_memory.h"

#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "backend/cpu/backend_cpu.h"
#include "data/corpus.h"
#include "data/data_file.h"
#include "data/data_spec.h"
#include "host/disk_state.h"
#include "io/file.h"
#include "util/mem.h"


/* One data file's bytes in memory, counted up to cap: 0 for a .mtok
 * (mapped); a compressed .mtok is read whole; JSONL is tokenized into int32
 * ids plus one loss-mask byte per token (then kept at 2 or 4 bytes and a
 * bit), and byte-level and byte-fallback tokenizers make at most about one
 * token per byte, so 1 + 5 bytes per byte of text bounds it. The text is
 * what the file decompresses to, counted by reading it: its size on disk
 * says nothing (a few kilobytes of zstd may hold gigabytes). */
static uint64_t file_bytes(const char *path, uint64_t cap, bool *partial) {
    char magic[4];
    size_t n;
    mt_compression c;
    uint64_t size;
    if (mt_data_file_compression(path, &c, NULL) || mt_data_file_head(path, magic, 4, &n, NULL))
        return 0;  // the load says what is wrong with it
    bool mtok = n == 4 && !memcmp(magic, "MTOK", 4);
    if (mtok && c == MT_COMPRESS_NONE) return 0;
    uint64_t text_cap = mtok ? cap : cap / 6;
    if (mt_data_file_size(path, text_cap, &size, NULL)) return 0;
    if (c != MT_COMPRESS_NONE && size > text_cap) *partial = true;  // counting stopped there
    return mtok ? size : size > UINT64_MAX / 6 ? UINT64_MAX : size * 6;
}

/* The data's bytes in memory (every file of every source), counted up to
 * cap; *partial when the count stopped there. */
static size_t data_bytes(const mt_train_config *tc, size_t cap, bool *partial) {
    *partial = false;
    if (!tc->data[0]) return MT_BUILTIN_TEXT_BYTES;
    mt_data_spec spec;
    if (mt_data_spec_parse(tc->data, "data", &spec, NULL)) return 0;
    uint64_t total = 0;
    for (size_t i = 0; i < spec.n; i++) {
        char **names = NULL;
        size_t n = 1;
        int64_t ignored = 0;
        if (mt_is_dir(spec.src[i].path)) {
            if (mt_corpus_list_shards(spec.src[i].path, &names, &n, &ignored, NULL)) n = 0;
        } else {
            names = mt_malloc_or_die(sizeof *names);
            names[0] = mt_strdup_or_die(spec.src[i].path);
        }
        for (size_t k = 0; k < n; k++) {
            if (total >= cap) *partial = true;  // already past: the rest is not counted
            uint64_t b = *partial ? 0 : file_bytes(names[k], cap - total, partial);
            total = b > UINT64_MAX - total ? UINT64_MAX : total + b;
            free(names[k]);
        }
        free(names);
    }
    mt_data_spec_free(&spec);
    return total > SIZE_MAX ? SIZE_MAX : (size_t)total;
}

/* The last layers whose m and v the run keeps on disk: 0 without nvme_dir
 * and while disk_layers is -1 (not chosen yet). */
static int disk_layers_of(const mt_train_config *tc, const mt_param_table *t) {
    return !tc->nvme_dir[0] || tc->disk_layers < 0 ? 0
           : tc->disk_layers < t->n_layers ? (int)tc->disk_layers : t->n_layers;
}

/* RAM the m and v (and weights) of the disk layers do not take, less
 * their bf16 copies and staging. */
static size_t disk_saving(const mt_train_config *tc, const mt_param_table *t) {
    double disk, freed;
    int n = disk_layers_of(tc, t), w = (int)tc->disk_weight_layers;
    mt_disk_tier_sizes(t, n, w < 0 ? 0 : w < n ? w : n, &disk, &freed);
    return freed > 0 ? (size_t)freed : 0;
}

/* *b for the run, its data's bytes given. */
static int compute(const mt_train_config *tc, const mt_config *cfg, const mt_param_table *t,
                   int store_grads, int cpu, size_t data, bool data_partial,
                   mt_train_host_bytes *b, mt_error *err) {
    memset(b, 0, sizeof *b);
    size_t rows, tokens, x;
    if (!mt_mul_size((size_t)tc->micro_batches, (size_t)tc->batch_size, &rows) ||
        !mt_mul_size(rows, (size_t)tc->seq_len, &tokens) || !mt_mul_size(tokens, 8, &b->batch) ||
        !mt_add_size(b->batch, 5 * ((size_t)tc->seq_len + 1), &b->batch))
        return mt_errorf(err, "micro_batches x batch_size x seq_len = %lld x %lld x %lld tokens "
                         "per step overflow 64 bits; lower --batch-size or --seq-len",
                         (long long)tc->micro_batches, (long long)tc->batch_size,
                         (long long)tc->seq_len);
    if (!mt_mul_size(t->total, sizeof(float) * (store_grads ? 4 : 3), &b->store))
        return mt_errorf(err, "the model's %zu parameters overflow 64 bits of bytes", t->total);
    b->store -= disk_saving(tc, t);
    if (cpu && mt_cpu_backend_bytes(cfg, t, (int)tc->micro_batches, tc->batch_size, tc->seq_len,
                                    &b->acts))
        return mt_errorf(err, "the CPU activations of %lld x %lld x %lld tokens overflow 64 "
                         "bits; lower --batch-size or --seq-len", (long long)tc->micro_batches,
                         (long long)tc->batch_size, (long long)tc->seq_len);
    b->data = data;
    b->data_partial = data_partial;
    if (!mt_add_size(b->store, b->acts, &x) || !mt_add_size(x, b->batch, &x) ||
        !mt_add_size(x, b->data, &b->total))
        return mt_errorf(err, "this run's host memory overflows 64 bits; lower --batch-size or "
                         "--seq-len");
    return 0;
}

int mt_train_host_bytes_compute(const mt_train_config *tc, const mt_config *cfg,
                                const mt_param_table *t, int store_grads, int cpu,
                                mt_train_host_bytes *b, mt_error *err) {
    bool partial;
    size_t data = data_bytes(tc, SIZE_MAX, &partial);
    return compute(tc, cfg, t, store_grads, cpu, data, partial, b, err);
}

int mt_train_disk_layers_needed(const mt_train_config *tc, const mt_config *cfg,
                                const mt_param_table *t, int store_grads, int cpu,
                                size_t available) {
    if (!tc->nvme_dir[0]) return 0;
    if (tc->disk_layers >= 0) return disk_layers_of(tc, t);
    bool partial;
    size_t data = data_bytes(tc, available ? available : SIZE_MAX, &partial);
    mt_train_config probe = *tc;
    for (int n = 0; n <= t->n_layers; n++) {
        probe.disk_layers = n;
        mt_train_host_bytes b;
        if (compute(&probe, cfg, t, store_grads, cpu, data, partial, &b, NULL)) return 0;
        if (!available || b.total <= available) return n;
    }
    return t->n_layers;
}

/* Whether tc with batch_size B and seq_len T fits in avail. */
static int fits(mt_train_config *tc, const mt_config *cfg, const mt_param_table *t, int grads,
                int cpu, size_t data, int64_t B, int64_t T, size_t avail) {
    tc->batch_size = B;
    tc->seq_len = T;
    mt_train_host_bytes b;
    return compute(tc, cfg, t, grads, cpu, data, false, &b, NULL) == 0 && b.total <= avail;
}

/* The largest v in [1, hi] with ok(v), by bisection (ok is monotone); 0 if none. */
static int64_t largest(mt_train_config *tc, const mt_config *cfg, const mt_param_table *t,
                       int grads, int cpu, size_t data, size_t avail, int64_t hi, int vary_B) {
    int64_t lo = 0;
    while (lo < hi) {
        int64_t mid = lo + (hi - lo + 1) / 2;
        int ok = vary_B ? fits(tc, cfg, t, grads, cpu, data, mid, tc->seq_len, avail)
                        : fits(tc, cfg, t, grads, cpu, data, 1, mid, avail);
        if (ok) lo = mid;
        else hi = mid - 1;
    }
    return lo;
}

static double gb(size_t n) { return (double)n / 1e9; }

int mt_train_check_host_memory(const mt_train_config *tc, const mt_config *cfg,
                               const mt_param_table *t, int store_grads, int cpu,
                               size_t available, size_t host_mem, mt_error *err) {
    /* the smaller of the two binds, and the message names it */
    bool budget = host_mem && (!available || host_mem < available);
    if (budget) available = host_mem;
    mt_train_host_bytes b;
    bool partial;
    /* counting compressed data stops once it alone is past what is available */
    size_t data = data_bytes(tc, available ? available : SIZE_MAX, &partial);
    if (compute(tc, cfg, t, store_grads, cpu, data, partial, &b, err)) return -1;
    if (!available || b.total <= available) return 0;
    mt_train_config probe = *tc;
    int64_t bmax = largest(&probe, cfg, t, store_grads, cpu, data, available, tc->batch_size, 1);
    probe = *tc;
    int64_t tmax =
        bmax ? 0 : largest(&probe, cfg, t, store_grads, cpu, data, available, tc->seq_len, 0);
    char fix[360];
    if (bmax)
        snprintf(fix, sizeof fix, "use --batch-size %lld or less (and more --micro-batches for "
                 "the same tokens per step), or train on a GPU",
                 (long long)bmax);
    else if (tmax)
        snprintf(fix, sizeof fix, "even --batch-size 1 does not fit: use --batch-size 1 and "
                 "--seq-len %lld or less", (long long)tmax);
    else if (b.store <= available && b.data > available - b.store)
        snprintf(fix, sizeof fix, "the data does not fit beside the model state: JSONL is "
                 "tokenized into memory; pre-tokenize it into a .mtok file (megatrain "
                 "tokenize), which is mapped instead, or use less data");
    else
        snprintf(fix, sizeof fix, "the model state alone does not fit: use a smaller model, "
                 "a machine with more RAM%s", tc->nvme_dir[0] ? "" : ", or keep the optimizer "
                 "state of some layers on disk (--nvme-dir)");
    if (budget) { /* the fix may also be a larger budget */
        size_t len = strlen(fix);
        snprintf(fix + len, sizeof fix - len, "; or raise --host-mem");
    }
    char have[96];
    if (budget)
        snprintf(have, sizeof have, "--host-mem allows %.2f GB", gb(available));
    else
        snprintf(have, sizeof have, "%.2f GB are available", gb(available));
    return mt_errorf(err, "this run needs %s%.2f GB of host RAM, %s: model "
                     "state %.2f GB, %s %.2f GB (%lld x %lld x %lld tokens), batch buffers "
                     "%.2f GB, data %s%.2f GB%s; %s", b.data_partial ? "more than " : "",
                     gb(b.total), have, gb(b.store),
                     cpu ? "CPU activations" : "activations on the GPU", gb(b.acts),
                     (long long)tc->micro_batches, (long long)tc->batch_size,
                     (long long)tc->seq_len, gb(b.batch), b.data_partial ? "more than " : "",
                     gb(b.data), b.data_partial ? " (compressed text, counted as it "
                     "decompresses until it alone was past what is available)" : "", fix);
}
