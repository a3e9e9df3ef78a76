/* CPU AdamW: the fused, vectorised, multi-threaded update of fp32 master
 * weights and Adam moments kept in host RAM.
 *
 * Semantics are those of torch.optim.AdamW (amsgrad=False, maximize=False)
 * in its default CPU implementation, the single-tensor one
 * (torch/optim/adam.py: _single_tensor_adam with decoupled weight decay),
 * with the fp32 operation order of the ATen CPU kernels it calls:
 *
 *   g  = grad * gscale                         (clip_grad_norm_'s g.mul_(coef))
 *   p  = p * (1 - lr*wd)                       (param.mul_)
 *   m  = fma(1-b1, g - m, m)                   (exp_avg.lerp_(g, 1-b1))
 *   v  = fma((1-b2) * g, g, v * b2)            (exp_avg_sq.mul_(b2).addcmul_(g, g, 1-b2))
 *   d  = sqrt(v) / sqrt(1 - b2^t) + eps        (exp_avg_sq.sqrt() / bc2_sqrt).add_(eps)
 *   p  = p + (-(lr / (1 - b1^t)) * m) / d      (param.addcdiv_(m, d, value=-step_size))
 *
 * Scalars (1 - lr*wd, step size, sqrt of bias correction 2) are computed in
 * double, as Python does, and rounded to float once, as the ATen kernels do.
 * The ATen vector kernels contract `a + b*c` into an FMA (seen on torch 2.15,
 * AVX2), hence the two fma above. The scalar reference, AVX2 and AVX-512
 * paths give bitwise identical results (same operations, IEEE sqrt/div, no
 * contraction: the sources are built in ISO C mode, -ffp-contract=off).
 * Against torch itself p may differ by one ulp in the update term because
 * torch's CPU sqrt (MKL VML) is not correctly rounded; m and v are bitwise
 * identical. */
#ifndef MT_OPTIM_ADAMW_H
#define MT_OPTIM_ADAMW_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "util/error.h"

typedef enum mt_isa { MT_ISA_SCALAR = 0, MT_ISA_AVX2 = 1, MT_ISA_AVX512 = 2 } mt_isa;

/* Which kernels the optimizer runs and on how many threads. Made once by
 * mt_optim_cpu_init and passed to every call (no global state). */
typedef struct mt_optim_cpu {
    mt_isa isa;
    int threads;       // OpenMP threads per call; <= 0 means omp_get_max_threads()
    // Non-temporal stores of p, m, v, shadow when all are 64-byte aligned.
    // Off by default: slower on the 16-core device host (4.0 vs 4.5 Gparam/s).
    bool stream_stores;
} mt_optim_cpu;

/* Hyper-parameters of one AdamW step. Doubles, because torch computes the
 * per-step scalars with Python floats. */
typedef struct mt_adamw_hparams {
    double lr;      // learning rate of this step (from the schedule)
    double beta1;
    double beta2;
    double eps;
    int64_t step;   // 1-based index of this update (torch's state["step"] after += 1)
} mt_adamw_hparams;

/* The fp32 scalars of one AdamW step, rounded once from doubles: what
 * every kernel (the CPU ones here, the GPU one of the CUDA backend) reads. */
typedef struct mt_adamw_coefs {
    float gscale;        // clip coefficient
    float decay;         // (float)(1 - lr*wd)
    float m_weight;      // lerp: m = fma(m_weight, g - m, m_base ? g : m)
    bool m_base_is_g;    // torch's lerp takes the other branch when |1-b1| >= 0.5
    float beta2;         // (float)b2
    float one_minus_beta2; // (float)(1 - b2)
    float bc2_sqrt;      // (float)sqrt(1 - b2^t)
    float eps;
    float neg_step_size; // (float)(-(lr / (1 - b1^t)))
} mt_adamw_coefs;

/* The scalars of one step for a tensor group with this weight decay and
 * clip coefficient, exactly as _single_tensor_adam rounds them. */
mt_adamw_coefs mt_adamw_coefs_make(const mt_adamw_hparams *h, double weight_decay,
                                   float gscale);

bool mt_isa_supported(mt_isa isa);
const char *mt_isa_name(mt_isa isa);
/* "scalar" | "avx2" | "avx512"; -1 with a message otherwise. */
int mt_isa_parse(const char *name, mt_isa *out, mt_error *err);

/* Best ISA of this CPU, or the one forced by $MT_ADAMW_ISA (error if this
 * CPU lacks it or the name is unknown). threads as in mt_optim_cpu. */
int mt_optim_cpu_init(mt_optim_cpu *cpu, int threads, mt_error *err);
/* A given ISA (for tests and benchmarks); -1 if this CPU lacks it. */
int mt_optim_cpu_init_isa(mt_optim_cpu *cpu, mt_isa isa, int threads, mt_error *err);

/* One AdamW step over n parameters, in place, in one pass:
 * p, m, v (n) read and written, g (n) read. gscale multiplies g (the clip
 * coefficient, 1.0f without clipping). weight_decay: the group's decay
 * (0 for norms and biases). bf16_shadow (n) may be NULL; if set it receives
 * bf16(p), round to nearest even (torch's .to(bfloat16); NaN -> 0x7FC0, where
 * torch's vector code gives 0xFFFF). Runs on cpu->threads OpenMP threads
 * from 65536 elements up, below that on the calling thread; the result does
 * not depend on the split. */
void mt_adamw_update(const mt_optim_cpu *cpu, float *p, float *m, float *v, const float *g,
                     uint16_t *bf16_shadow, size_t n, const mt_adamw_hparams *h,
                     double weight_decay, float gscale);

/* mt_adamw_update with a bf16 gradient: each block of g16 is widened to
 * fp32 (exact) in a small per-thread buffer and handed to the same kernel,
 * so the result (and the shadow's, when bf16_shadow is set) is bitwise
 * that of mt_adamw_update on the widened gradient; g is read at 2 bytes
 * per parameter. */
void mt_adamw_update_g16(const mt_optim_cpu *cpu, float *p, float *m, float *v,
                         const uint16_t *g16, uint16_t *bf16_shadow, size_t n,
                         const mt_adamw_hparams *h, double weight_decay, float gscale);

/* Gparam/s of the update (no shadow) with cpu on n_params random
 * parameters, best of a few runs; < 0 when memory cannot be had. */
double mt_adamw_measure(const mt_optim_cpu *cpu, size_t n_params);

/* Times the update on n_params random parameters with `threads` threads
 * (<= 0: all) and prints ISA, threads, Gparam/s and GB/s to out. 0, or -1
 * when memory cannot be had. */
int mt_adamw_bench(size_t n_params, int threads, FILE *out);

#endif
