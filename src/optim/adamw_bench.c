/* `megatrain bench adamw`: speed of the fused AdamW update on random data,
 * for the best ISA of this CPU (and AVX2 when AVX-512 is best, to compare),
 * with and without the bf16 shadow and non-temporal stores. Reports
 * Gparam/s and the effective memory rate: 32 bytes per parameter (read g,
 * p, m, v; write p, m, v), 34 with the shadow. */
#include <omp.h>
#include <stdlib.h>

#include "optim/adamw.h"
#include "util/mem.h"

#define BENCH_WARMUP 2
#define BENCH_ITERS 10
// Same split as mt_adamw_update, so each page is first touched by the
// thread that will update it.
#define BENCH_BLOCK ((size_t)8192)

typedef struct bench_bufs {
    float *p, *m, *v, *g; // (n) each
    uint16_t *shadow;     // (n)
    size_t n;
} bench_bufs;

static float uniform(uint64_t *s, float lo, float hi) {
    *s ^= *s << 13; *s ^= *s >> 7; *s ^= *s << 17;
    return lo + (hi - lo) * (float)((*s >> 40) * (1.0 / 16777216.0));
}

static void bench_fill(bench_bufs *b, int threads) {
    const size_t nblocks = (b->n + BENCH_BLOCK - 1) / BENCH_BLOCK;
#pragma omp parallel for schedule(static) num_threads(threads)
    for (size_t blk = 0; blk < nblocks; blk++) {
        uint64_t s = 0x9E3779B97F4A7C15ull * (blk + 1);
        size_t end = (blk + 1) * BENCH_BLOCK < b->n ? (blk + 1) * BENCH_BLOCK : b->n;
        for (size_t i = blk * BENCH_BLOCK; i < end; i++) {
            b->p[i] = uniform(&s, -0.05f, 0.05f);
            b->m[i] = uniform(&s, -1e-3f, 1e-3f);
            b->v[i] = uniform(&s, 1e-8f, 1e-6f);
            b->g[i] = uniform(&s, -1e-2f, 1e-2f);
            b->shadow[i] = 0;
        }
    }
}

static double bench_one(const mt_optim_cpu *cpu, bench_bufs *b, bool shadow) {
    mt_adamw_hparams h = {.lr = 1e-4, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .step = 1};
    double best = 1e30;
    for (int it = 0; it < BENCH_WARMUP + BENCH_ITERS; it++, h.step++) {
        double t0 = omp_get_wtime();
        mt_adamw_update(cpu, b->p, b->m, b->v, b->g, shadow ? b->shadow : NULL, b->n, &h, 0.1,
                        0.5f);
        double dt = omp_get_wtime() - t0;
        if (it >= BENCH_WARMUP && dt < best) best = dt;
    }
    return best;
}

static void bench_free(bench_bufs *b) {
    free(b->p);
    free(b->m);
    free(b->v);
    free(b->g);
    free(b->shadow);
}

/* 0, or -1 with everything freed. */
static int bench_alloc(bench_bufs *b, size_t n_params) {
    *b = (bench_bufs){.n = n_params};
    size_t fbytes, hbytes;
    if (!mt_mul_size(n_params, sizeof(float), &fbytes) ||
        !mt_mul_size(n_params, sizeof(uint16_t), &hbytes))
        return -1;
    b->p = mt_aligned_alloc_try(64, fbytes);
    b->m = mt_aligned_alloc_try(64, fbytes);
    b->v = mt_aligned_alloc_try(64, fbytes);
    b->g = mt_aligned_alloc_try(64, fbytes);
    b->shadow = mt_aligned_alloc_try(64, hbytes);
    if (b->p && b->m && b->v && b->g && b->shadow) return 0;
    bench_free(b);
    return -1;
}

double mt_adamw_measure(const mt_optim_cpu *cpu, size_t n_params) {
    bench_bufs b;
    if (bench_alloc(&b, n_params)) return -1;
    bench_fill(&b, cpu->threads > 0 ? cpu->threads : omp_get_max_threads());
    double dt = bench_one(cpu, &b, false);
    bench_free(&b);
    return (double)n_params / dt / 1e9;
}

int mt_adamw_bench(size_t n_params, int threads, FILE *out) {
    if (threads <= 0) threads = omp_get_max_threads();
    bench_bufs b;
    int rc = -1;
    if (bench_alloc(&b, n_params)) {
        fprintf(out, "adamw bench: cannot allocate %zu parameters (%.2f GB)\n", n_params,
                18.0 * n_params / 1e9);
        return -1;
    }
    bench_fill(&b, threads);
    mt_error err;
    mt_optim_cpu best;
    if (mt_optim_cpu_init(&best, threads, &err)) {
        fprintf(out, "adamw bench: %s\n", err.msg);
        goto done;
    }
    mt_isa isas[2] = {best.isa, MT_ISA_AVX2};
    int nisa = best.isa == MT_ISA_AVX512 ? 2 : 1;
    fprintf(out, "adamw: %zu params, %d threads, best of %d runs\n", n_params, threads,
            BENCH_ITERS);
    fprintf(out, "%-7s %-7s %-6s %10s %8s\n", "isa", "stream", "shadow", "Gparam/s", "GB/s");
    for (int k = 0; k < nisa; k++) {
        for (int stream = 0; stream <= 1; stream++) {
            for (int shadow = 0; shadow <= 1; shadow++) {
                mt_optim_cpu cpu = {.isa = isas[k], .threads = threads,
                                    .stream_stores = stream};
                double dt = bench_one(&cpu, &b, shadow);
                double gps = (double)n_params / dt / 1e9;
                fprintf(out, "%-7s %-7s %-6s %10.3f %8.1f\n", mt_isa_name(cpu.isa),
                        stream ? "yes" : "no", shadow ? "yes" : "no", gps,
                        gps * (shadow ? 34 : 32));
            }
        }
    }
    rc = 0;
done:
    bench_free(&b);
    return rc;
}
