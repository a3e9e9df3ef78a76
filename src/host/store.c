/* Host store allocation and random initialisation. */
#include "host/store.h"

#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "optim/kernels.h"
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

/* What of layer l's range of an array (0 w, 1 m, 2 v, 3 g, 4 the bf16
 * copy w16) takes RAM under the homes `home` (MT_HOME_*, NULL: all in
 * RAM). */
enum { TOUCH_NONE, TOUCH_ALL, TOUCH_EXACT };
static int touch_of(const uint8_t *home, int l, int array) {
    int h = home ? home[l] : MT_HOME_RAM;
    if (array == 4) return h == MT_HOME_DISK_WEIGHTS ? TOUCH_ALL : TOUCH_NONE;
    if (array == 1 || array == 2) return h >= MT_HOME_DISK_STATE ? TOUCH_NONE : TOUCH_ALL;
    if (array == 0 && h == MT_HOME_DISK_WEIGHTS) return TOUCH_EXACT;
    return TOUCH_ALL;
}

/* Zeroes (first touch) what of layer l's range of p (elem bytes an
 * element) takes RAM: all of it, or only the tensors the GPU reads in
 * fp32 (mt_tensor_read_fp32), whose pages then stay small pages (a huge
 * page would put 2 MiB of RAM behind each). */
static void touch_layer(void *p, size_t elem, const mt_param_table *t, int l, int touch) {
    const mt_layer_desc *ld = &t->layers[l];
    char *base = (char *)p + ld->offset * elem;
    if (touch == TOUCH_ALL) {
        if (elem == sizeof(float)) parallel_zero((float *)base, ld->numel);
        else memset(base, 0, ld->numel * elem);
        return;
    }
    if (touch == TOUCH_NONE) return;
#ifdef MADV_NOHUGEPAGE
    (void)madvise(base, ld->numel * elem, MADV_NOHUGEPAGE);
#endif
    for (int k = 0; k < ld->n_tensors; k++)
        if (mt_tensor_read_fp32(&ld->tensors[k]))
            memset(base + ld->tensors[k].offset * elem, 0, ld->tensors[k].numel * elem);
}

/* An array of `bytes` of which only some layers' ranges take RAM (some
 * state on disk): address space reserved without RAM behind it
 * (MAP_NORESERVE: a model larger than the RAM is not refused for it),
 * the ranges touch(l) says touched. */
static void *reserve(const mt_param_table *t, size_t bytes, size_t elem, const uint8_t *home,
                     int array) {
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) return NULL;
#ifdef MADV_HUGEPAGE
    (void)madvise(p, bytes, MADV_HUGEPAGE);
#endif
    for (int l = 0; l < t->n_layers; l++) touch_layer(p, elem, t, l, touch_of(home, l, array));
    return p;
}

/* Bytes of RAM an array (numbered as in touch_of) takes under the homes. */
static size_t ram_of(const mt_param_table *t, const uint8_t *home, int array) {
    size_t ram = 0;
    for (int l = 0; l < t->n_layers; l++) {
        const mt_layer_desc *ld = &t->layers[l];
        int touch = touch_of(home, l, array);
        if (touch == TOUCH_ALL) ram += ld->numel * (array < 4 ? sizeof(float) : sizeof(uint16_t));
        for (int k = 0; touch == TOUCH_EXACT && k < ld->n_tensors; k++)
            if (mt_tensor_read_fp32(&ld->tensors[k])) ram += ld->tensors[k].numel * sizeof(float);
    }
    return ram;
}

static int any_weights_away(const mt_param_table *t, const uint8_t *home) {
    for (int l = 0; home && l < t->n_layers; l++)
        if (home[l] == MT_HOME_DISK_WEIGHTS) return 1;
    return 0;
}

static int short_of_memory(mt_host_store *s, size_t n_arrays, size_t bytes, mt_error *err) {
    mt_host_store_free(s);
    return mt_errorf(err, "host memory: could not allocate %.2f GiB for the model state (%zu "
                     "arrays of %.2f GiB); use a smaller model or a machine with more RAM",
                     (double)n_arrays * bytes / (1 << 30), n_arrays, (double)bytes / (1 << 30));
}

int mt_host_store_create_tiered(mt_host_store *s, const mt_param_table *t, int grads,
                                const uint8_t *home, mt_error *err) {
    memset(s, 0, sizeof *s);
    s->table = t;
    size_t bytes;
    if (!mt_mul_size(t->total, sizeof(float), &bytes))
        return mt_errorf(err, "model too large for this machine's address space");
    float **arrays[] = {&s->w, &s->m, &s->v, &s->g};
    size_t n_arrays = grads ? 4 : 3, padded = mt_round_up(bytes, HUGE_PAGE);
    int w_away = any_weights_away(t, home);
    for (size_t i = 0; i < n_arrays; i++) {
        if ((home && (i == 1 || i == 2)) || (w_away && i == 0)) {
            *arrays[i] = reserve(t, padded, sizeof(float), home, (int)i);
            if (!*arrays[i]) return short_of_memory(s, n_arrays, bytes, err);
            *(i == 0 ? &s->w_mapped : &s->mv_mapped) = padded;
            continue;
        }
        *arrays[i] = mt_aligned_alloc_try(HUGE_PAGE, padded);
        if (!*arrays[i]) return short_of_memory(s, n_arrays, bytes, err);
#ifdef MADV_HUGEPAGE
        (void)madvise(*arrays[i], padded, MADV_HUGEPAGE); /* a hint: failure changes nothing */
#endif
        parallel_zero(*arrays[i], t->total);
    }
    if (w_away) {
        s->w16_mapped = mt_round_up(t->total * sizeof(uint16_t), HUGE_PAGE);
        s->w16 = reserve(t, s->w16_mapped, sizeof(uint16_t), home, 4);
        if (!s->w16) return short_of_memory(s, n_arrays, bytes, err);
    }
    s->bytes = 0;
    for (size_t i = 0; i < n_arrays; i++) s->bytes += home ? ram_of(t, home, (int)i) : bytes;
    if (w_away) s->bytes += ram_of(t, home, 4);
    return 0;
}

void mt_host_store_free(mt_host_store *s) {
    if (s->w_mapped && s->w) munmap(s->w, s->w_mapped);
    else free(s->w);
    if (s->w16) munmap(s->w16, s->w16_mapped);
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

void mt_host_store_keep_exact(mt_host_store *s, int l, const float *w) {
    const mt_layer_desc *ld = &s->table->layers[l];
    float *dst = mt_store_layer(s->w, s->table, l);
    for (int k = 0; k < ld->n_tensors; k++) {
        const mt_tensor_desc *td = &ld->tensors[k];
        if (mt_tensor_read_fp32(td))
            memcpy(dst + td->offset, w + td->offset, td->numel * sizeof(float));
    }
}

void mt_host_store_set_copy(mt_host_store *s, int l, const float *w) {
    const mt_layer_desc *ld = &s->table->layers[l];
    uint16_t *dst = s->w16 + ld->offset;
#pragma omp parallel for schedule(static) if (ld->numel > 65536)
    for (size_t i = 0; i < ld->numel; i++) dst[i] = mt_bf16_rne(w[i]);
    mt_host_store_keep_exact(s, l, w);
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
