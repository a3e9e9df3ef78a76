/* AdamW update: per-step scalars, ISA choice and the OpenMP split. The
 * kernels live in kernels_scalar.c (the reference), adamw_avx2.c and
 * adamw_avx512.c, which must give the same bits as the reference. */
#include "optim/adamw.h"

#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "optim/kernels.h"

// Elements per OpenMP work item: 5 arrays x 32 KiB stay within L2 while a
// thread works on a block; a multiple of 16 keeps blocks 64-byte aligned.
#define ADAMW_BLOCK ((size_t)8192)
// Below this many elements threads cost more than they save.
#define ADAMW_MIN_PARALLEL ((size_t)65536)
// Blocks handed out per grab. Dynamic, not static: inside a training step
// the update shares the cores with the engine's threads and the DMA of the
// copies, and a static split waits for its slowest thread; 2 blocks (448
// KiB of traffic) make the grab's cost negligible.
#define ADAMW_GRAB 2

/* The scalars exactly as _single_tensor_adam computes them: Python doubles,
 * then one rounding to float when ATen reads the Scalar. */
mt_adamw_coefs mt_adamw_coefs_make(const mt_adamw_hparams *h, double weight_decay,
                                   float gscale) {
    MT_ASSERT(h->step >= 1);
    double step = (double)h->step;
    double bc1 = 1.0 - pow(h->beta1, step);
    double bc2 = 1.0 - pow(h->beta2, step);
    float w = (float)(1.0 - h->beta1);
    bool small = fabsf(w) < 0.5f; // at::native::is_lerp_weight_small
    return (mt_adamw_coefs){
        .gscale = gscale,
        .decay = (float)(1.0 - h->lr * weight_decay),
        .m_weight = small ? w : w - 1.0f,
        .m_base_is_g = !small,
        .beta2 = (float)h->beta2,
        .one_minus_beta2 = (float)(1.0 - h->beta2),
        .bc2_sqrt = (float)pow(bc2, 0.5),
        .eps = (float)h->eps,
        .neg_step_size = (float)-(h->lr / bc1),
    };
}

static mt_adamw_kernel adamw_kernel(mt_isa isa) {
    switch (isa) {
    case MT_ISA_AVX512: return mt_adamw_kernel_avx512;
    case MT_ISA_AVX2: return mt_adamw_kernel_avx2;
    default: return mt_adamw_kernel_scalar;
    }
}

static bool aligned64(const void *ptr) { return ((uintptr_t)ptr & 63) == 0; }

/* One update over n elements: fp32 gradients g, or bf16 ones g16 widened
 * on the way. */
typedef struct update_job {
    mt_adamw_kernel kernel;
    float *p, *m, *v;
    const float *g;
    const uint16_t *g16;
    uint16_t *bf16_shadow;
    mt_adamw_coefs c;
    bool stream;
} update_job;

/* Widens bf16 bits to fp32 (exact: bf16 is the top half of an fp32). */
static void widen_bf16(float *out, const uint16_t *in, size_t n) {
    for (size_t i = 0; i < n; i++) {
        union { uint32_t u; float f; } b = {(uint32_t)in[i] << 16};
        out[i] = b.f;
    }
}

/* Elements [i, i + n) on the calling thread; bf16 gradients are widened in
 * pieces that stay in L1 beside the kernel's streams. */
#define G16_PIECE ((size_t)2048)
static void update_block(const update_job *j, size_t i, size_t n) {
    if (j->g) {
        j->kernel(j->p + i, j->m + i, j->v + i, j->g + i,
                  j->bf16_shadow ? j->bf16_shadow + i : NULL, n, &j->c, j->stream);
        return;
    }
    float g[G16_PIECE] __attribute__((aligned(64)));
    for (size_t k = i; k < i + n; k += G16_PIECE) {
        size_t len = i + n - k < G16_PIECE ? i + n - k : G16_PIECE;
        widen_bf16(g, j->g16 + k, len);
        j->kernel(j->p + k, j->m + k, j->v + k, g, j->bf16_shadow ? j->bf16_shadow + k : NULL,
                  len, &j->c, false);
    }
}

static void update(const mt_optim_cpu *cpu, const update_job *j, size_t n) {
    if (n < ADAMW_MIN_PARALLEL) {
        update_block(j, 0, n);
        return;
    }
    const int threads = cpu->threads > 0 ? cpu->threads : omp_get_max_threads();
    const size_t nblocks = (n + ADAMW_BLOCK - 1) / ADAMW_BLOCK;
#pragma omp parallel for schedule(dynamic, ADAMW_GRAB) num_threads(threads)
    for (size_t b = 0; b < nblocks; b++) {
        size_t i = b * ADAMW_BLOCK;
        update_block(j, i, n - i < ADAMW_BLOCK ? n - i : ADAMW_BLOCK);
    }
}

void mt_adamw_update(const mt_optim_cpu *cpu, float *p, float *m, float *v, const float *g,
                     uint16_t *bf16_shadow, size_t n, const mt_adamw_hparams *h,
                     double weight_decay, float gscale) {
    update_job j = {.kernel = adamw_kernel(cpu->isa), .p = p, .m = m, .v = v, .g = g,
                    .bf16_shadow = bf16_shadow, .c = mt_adamw_coefs_make(h, weight_decay, gscale)};
    j.stream = cpu->stream_stores && aligned64(p) && aligned64(m) && aligned64(v) &&
               (!bf16_shadow || aligned64(bf16_shadow));
    update(cpu, &j, n);
}

void mt_adamw_update_g16(const mt_optim_cpu *cpu, float *p, float *m, float *v,
                         const uint16_t *g16, uint16_t *bf16_shadow, size_t n,
                         const mt_adamw_hparams *h, double weight_decay, float gscale) {
    update_job j = {.kernel = adamw_kernel(cpu->isa), .p = p, .m = m, .v = v, .g16 = g16,
                    .bf16_shadow = bf16_shadow,
                    .c = mt_adamw_coefs_make(h, weight_decay, gscale)};
    update(cpu, &j, n);
}

bool mt_isa_supported(mt_isa isa) {
    __builtin_cpu_init();
    switch (isa) {
    case MT_ISA_SCALAR: return true;
    case MT_ISA_AVX2:
        return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    case MT_ISA_AVX512:
        return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
               __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
               __builtin_cpu_supports("fma");
    }
    return false;
}

const char *mt_isa_name(mt_isa isa) {
    switch (isa) {
    case MT_ISA_SCALAR: return "scalar";
    case MT_ISA_AVX2: return "avx2";
    case MT_ISA_AVX512: return "avx512";
    }
    return "?";
}

int mt_isa_parse(const char *name, mt_isa *out, mt_error *err) {
    for (int i = MT_ISA_SCALAR; i <= MT_ISA_AVX512; i++) {
        if (!strcmp(name, mt_isa_name((mt_isa)i))) {
            *out = (mt_isa)i;
            return 0;
        }
    }
    return mt_errorf(err, "unknown instruction set '%s': use scalar, avx2 or avx512", name);
}

int mt_optim_cpu_init_isa(mt_optim_cpu *cpu, mt_isa isa, int threads, mt_error *err) {
    if (!mt_isa_supported(isa))
        return mt_errorf(err, "this CPU lacks the %s instructions: choose another with "
                              "MT_ADAMW_ISA (scalar, avx2, avx512) or leave it unset",
                         mt_isa_name(isa));
    *cpu = (mt_optim_cpu){.isa = isa, .threads = threads, .stream_stores = false};
    return 0;
}

int mt_optim_cpu_init(mt_optim_cpu *cpu, int threads, mt_error *err) {
    const char *forced = getenv("MT_ADAMW_ISA");
    mt_isa isa;
    if (forced && *forced) {
        if (mt_isa_parse(forced, &isa, err)) return mt_error_prefix(err, "MT_ADAMW_ISA: ");
    } else {
        isa = mt_isa_supported(MT_ISA_AVX512) ? MT_ISA_AVX512
              : mt_isa_supported(MT_ISA_AVX2) ? MT_ISA_AVX2
                                              : MT_ISA_SCALAR;
    }
    if (mt_optim_cpu_init_isa(cpu, isa, threads, err))
        return mt_error_prefix(err, "MT_ADAMW_ISA=%s: ", forced ? forced : "");
    return 0;
}
