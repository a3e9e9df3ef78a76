/* Host bytes of a training run from its options, and the refusal of one
 * that does not fit in RAM. */
#include "train/train_memory.h"

#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "backend/cpu/backend_cpu.h"
#include "host/disk_state.h"
#include "util/mem.h"


/* JSONL is read whole, then tokenized into int32 ids plus one loss-mask byte
 * per token; byte-level and byte-fallback tokenizers make at most about one
 * token per byte, so 1 + 5 bytes per file byte bounds it. */
static size_t data_bytes(const mt_train_config *tc) {
    if (!tc->data[0]) return MT_BUILTIN_TEXT_BYTES;
    size_t n = strlen(tc->data);
    struct stat st;
    if ((n > 5 && !strcmp(tc->data + n - 5, ".mtok")) || stat(tc->data, &st) != 0) return 0;
    size_t b;
    return mt_mul_size((size_t)st.st_size, 6, &b) ? b : SIZE_MAX;
}

/* The last layers whose m and v the run keeps on disk: 0 without nvme_dir
 * and while disk_layers is -1 (not chosen yet). */
static int disk_layers_of(const mt_train_config *tc, const mt_param_table *t) {
    return !tc->nvme_dir[0] || tc->disk_layers < 0 ? 0
           : tc->disk_layers < t->n_layers ? (int)tc->disk_layers : t->n_layers;
}

/* RAM the m and v of the disk layers do not take, less their staging. */
static size_t disk_saving(const mt_train_config *tc, const mt_param_table *t) {
    double disk, freed;
    mt_disk_tier_sizes(t, disk_layers_of(tc, t), &disk, &freed);
    return freed > 0 ? (size_t)freed : 0;
}

int mt_train_disk_layers_needed(const mt_train_config *tc, const mt_config *cfg,
                                const mt_param_table *t, int store_grads, int cpu,
                                size_t available) {
    if (!tc->nvme_dir[0]) return 0;
    if (tc->disk_layers >= 0) return disk_layers_of(tc, t);
    mt_train_config probe = *tc;
    for (int n = 0; n <= t->n_layers; n++) {
        probe.disk_layers = n;
        mt_train_host_bytes b;
        if (mt_train_host_bytes_compute(&probe, cfg, t, store_grads, cpu, &b, NULL)) return 0;
        if (!available || b.total <= available) return n;
    }
    return t->n_layers;
}

int mt_train_host_bytes_compute(const mt_train_config *tc, const mt_config *cfg,
                                const mt_param_table *t, int store_grads, int cpu,
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
    b->data = data_bytes(tc);
    if (!mt_add_size(b->store, b->acts, &x) || !mt_add_size(x, b->batch, &x) ||
        !mt_add_size(x, b->data, &b->total))
        return mt_errorf(err, "this run's host memory overflows 64 bits; lower --batch-size or "
                         "--seq-len");
    return 0;
}

/* Whether tc with batch_size B and seq_len T fits in avail. */
static int fits(mt_train_config *tc, const mt_config *cfg, const mt_param_table *t, int grads,
                int cpu, int64_t B, int64_t T, size_t avail) {
    tc->batch_size = B;
    tc->seq_len = T;
    mt_train_host_bytes b;
    return mt_train_host_bytes_compute(tc, cfg, t, grads, cpu, &b, NULL) == 0 && b.total <= avail;
}

/* The largest v in [1, hi] with ok(v), by bisection (ok is monotone); 0 if none. */
static int64_t largest(mt_train_config *tc, const mt_config *cfg, const mt_param_table *t,
                       int grads, int cpu, size_t avail, int64_t hi, int vary_B) {
    int64_t lo = 0;
    while (lo < hi) {
        int64_t mid = lo + (hi - lo + 1) / 2;
        int ok = vary_B ? fits(tc, cfg, t, grads, cpu, mid, tc->seq_len, avail)
                        : fits(tc, cfg, t, grads, cpu, 1, mid, avail);
        if (ok) lo = mid;
        else hi = mid - 1;
    }
    return lo;
}

static double gb(size_t n) { return (double)n / 1e9; }

int mt_train_check_host_memory(const mt_train_config *tc, const mt_config *cfg,
                               const mt_param_table *t, int store_grads, int cpu,
                               size_t available, mt_error *err) {
    mt_train_host_bytes b;
    if (mt_train_host_bytes_compute(tc, cfg, t, store_grads, cpu, &b, err)) return -1;
    if (!available || b.total <= available) return 0;
    mt_train_config probe = *tc;
    int64_t bmax = largest(&probe, cfg, t, store_grads, cpu, available, tc->batch_size, 1);
    probe = *tc;
    int64_t tmax = bmax ? 0 : largest(&probe, cfg, t, store_grads, cpu, available, tc->seq_len, 0);
    char fix[256];
    if (bmax)
        snprintf(fix, sizeof fix, "use --batch-size %lld or less (and more --micro-batches for "
                 "the same tokens per step), or train on a GPU",
                 (long long)bmax);
    else if (tmax)
        snprintf(fix, sizeof fix, "even --batch-size 1 does not fit: use --batch-size 1 and "
                 "--seq-len %lld or less", (long long)tmax);
    else
        snprintf(fix, sizeof fix, "the model state alone does not fit: use a smaller model, "
                 "a machine with more RAM%s", tc->nvme_dir[0] ? "" : ", or keep the optimizer "
                 "state of some layers on disk (--nvme-dir)");
    return mt_errorf(err, "this run needs %.2f GB of host RAM, %.2f GB are available: model "
                     "state %.2f GB, %s %.2f GB (%lld x %lld x %lld tokens), batch buffers "
                     "%.2f GB, data %.2f GB; %s", gb(b.total), gb(available), gb(b.store),
                     cpu ? "CPU activations" : "activations on the GPU", gb(b.acts),
                     (long long)tc->micro_batches, (long long)tc->batch_size,
                     (long long)tc->seq_len, gb(b.batch), gb(b.data), fix);
}
