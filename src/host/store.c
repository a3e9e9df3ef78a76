/* Host store allocation and random initialisation. */
#include "host/store.h"

#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "util/mem.h"

#define PAGE 4096
/* Arrays start on a 2 MiB boundary and ask for transparent huge pages
 * (honoured where the kernel's THP mode is madvise or always): the CPU
 * AdamW streams through all of them every step, and 4 KiB pages cost it
 * TLB misses. */
#define HUGE_PAGE ((size_t)2 << 20)

/* First touch in parallel so pages spread over the memory controllers and
 * the cost of faulting them in is paid by all cores. */
static void parallel_zero(float *p, size_t n) {
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i += PAGE / sizeof(float)) {
        size_t k = n - i < PAGE / sizeof(float) ? n - i : PAGE / sizeof(float);
        memset(p + i, 0, k * sizeof(float));
    }
}

int mt_host_store_init(mt_host_store *s, const mt_param_table *t, mt_error *err) {
    return mt_host_store_create(s, t, 1, err);
}

int mt_host_store_create(mt_host_store *s, const mt_param_table *t, int grads, mt_error *err) {
    return mt_host_store_create_tiered(s, t, grads, NULL, err);
}

/* m or v when some layers' state is on disk: address space reserved
 * without RAM behind it (MAP_NORESERVE: a model larger than the RAM is
 * not refused for it), the RAM layers touched. */
static float *reserve_state(const mt_param_table *t, const uint8_t *on_disk, size_t bytes) {
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) return NULL;
#ifdef MADV_HUGEPAGE
    (void)madvise(p, bytes, MADV_HUGEPAGE);
#endif
    for (int l = 0; l < t->n_layers; l++)
        if (!on_disk[l]) parallel_zero((float *)p + t->layers[l].offset, t->layers[l].numel);
    return p;
}

int mt_host_store_create_tiered(mt_host_store *s, const mt_param_table *t, int grads,
                                const uint8_t *on_disk, mt_error *err) {
    memset(s, 0, sizeof *s);
    s->table = t;
    size_t bytes;
    if (!mt_mul_size(t->total, sizeof(float), &bytes))
        return mt_errorf(err, "model too large for this machine's address space");
    float **arrays[] = {&s->w, &s->m, &s->v, &s->g};
    size_t n_arrays = grads ? 4 : 3, state_ram = 0;
    for (int l = 0; on_disk && l < t->n_layers; l++)
        if (!on_disk[l]) state_ram += t->layers[l].numel * sizeof(float);
    for (size_t i = 0; i < n_arrays; i++) {
        size_t padded = mt_round_up(bytes, HUGE_PAGE);
        if (on_disk && (i == 1 || i == 2)) {
            *arrays[i] = reserve_state(t, on_disk, padded);
            if (*arrays[i]) {
                s->mv_mapped = padded;
                continue;
            }
        } else {
            *arrays[i] = mt_aligned_alloc_try(HUGE_PAGE, padded);
        }
        if (!*arrays[i]) {
            mt_host_store_free(s);
            return mt_errorf(err, "host memory: could not allocate %.2f GiB for the model "
                             "state (%zu arrays of %.2f GiB); use a smaller model or a machine "
                             "with more RAM", (double)n_arrays * bytes / (1 << 30), n_arrays,
                             (double)bytes / (1 << 30));
        }
#ifdef MADV_HUGEPAGE
        (void)madvise(*arrays[i], padded, MADV_HUGEPAGE); /* a hint: failure changes nothing */
#endif
        parallel_zero(*arrays[i], t->total);
    }
    s->bytes = on_disk ? (n_arrays - 2) * bytes + 2 * state_ram : n_arrays * bytes;
    return 0;
}

void mt_host_store_free(mt_host_store *s) {
    free(s->w);
    if (s->mv_mapped) {
        if (s->m) munmap(s->m, s->mv_mapped);
        if (s->v) munmap(s->v, s->mv_mapped);
    } else {
        free(s->m);
        free(s->v);
    }
    free(s->g);
    memset(s, 0, sizeof *s);
}

/* A counter-based hash: element i of tensor k of layer l gets the same
 * value whatever the thread count or visiting order. */
static uint64_t mix(uint64_t z) {
    z += 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

void mt_host_store_init_random(mt_host_store *s, uint64_t seed, float std) {
    const mt_param_table *t = s->table;
    for (int l = 0; l < t->n_layers; l++)
        mt_host_store_random_range(t, l, 0, t->layers[l].numel, seed, std,
                                   mt_store_layer(s->w, t, l));
}

void mt_host_store_random_range(const mt_param_table *t, int l, size_t begin, size_t end,
                                uint64_t seed, float std, float *out) {
    /* Uniform on [-a, a] has standard deviation a / sqrt(3). */
    const float a = std * 1.7320508f;
    const mt_layer_desc *ld = &t->layers[l];
    for (int k = 0; k < ld->n_tensors; k++) {
        const mt_tensor_desc *td = &ld->tensors[k];
        size_t tb = td->offset > begin ? td->offset : begin;
        size_t te = td->offset + td->numel < end ? td->offset + td->numel : end;
        if (tb >= te) continue;
        float *p = out + (tb - begin);
        size_t first = tb - td->offset, n = te - tb; /* elements of the tensor */
        if (td->ndim == 1) {
            /* norms start at the identity: w = 1, or 0 where they scale by 1 + w */
            int zero = mt_role_is_bias(td->role) || t->norm_offset;
            for (size_t i = 0; i < n; i++) p[i] = zero ? 0.0f : 1.0f;
            continue;
        }
        uint64_t key = mix(seed ^ ((uint64_t)l << 40) ^ ((uint64_t)k << 32));
#pragma omp parallel for schedule(static)
        for (size_t i = 0; i < n; i++) {
            double u = (double)(mix(key + first + i) >> 11) * (1.0 / 9007199254740992.0);
            p[i] = (float)((2.0 * u - 1.0) * a);
        }
    }
}
