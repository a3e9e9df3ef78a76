/* The device memory layout of the mixture-of-experts module (see
 * moe_cuda_internal.h): plain C, compiled in every build, so that the
 * placement planner sizes MoE runs also on a machine without CUDA. */
#include "backend/cuda/moe_cuda_internal.h"

#include "kernels/moe/moe_gemm.h"
#include "kernels/moe/moe_route.h"

/* The buffers of m, carved from one device range (mt_arena). */
static void *take(mt_arena *a, size_t n, size_t elem) {
    return mt_arena_take(a, n, elem, MOE_ALIGN);
}

/* n x m elements of elem bytes, with the product checked. */
static void *take2(mt_arena *a, size_t n, size_t m, size_t elem) {
    size_t nm;
    if (!mt_mul_size(n, m, &nm)) {
        a->overflow = true;
        return NULL;
    }
    return take(a, nm, elem);
}

static void carve(mt_cuda_moe *m, mt_arena *a) {
    size_t N = m->N, C = m->C, E = m->E, K = m->K, FE = m->FE, FS = m->FS, es = m->es, NK;
    if (!mt_mul_size(N, K, &NK) || NK > (size_t)INT32_MAX) { /* int32 grouped rows */
        a->overflow = true;
        return;
    }
    m->NK = NK;
    m->p = take2(a, N, E, 4);
    m->sel = take(a, NK, 4);
    m->wk = take(a, NK, 4);
    m->psel = take(a, N, 4);
    m->start = take(a, E + 1, 4);
    m->row = take(a, NK, 4);
    m->tok = take(a, NK, 4);
    m->hist = take(a, mt_cuda_moe_group_scratch(NK, (int)E), 4);
    m->xn32 = m->prec == MT_PREC_BF16 ? take2(a, N, C, 4) : NULL;
    m->xg = take2(a, NK, C, es);
    m->hg = take2(a, NK, FE, es);
    m->hu = take2(a, NK, FE, es);
    m->hh = take2(a, NK, FE, es);
    m->y = take2(a, NK, C, 4);
    if (FS) {
        m->sg = take2(a, N, FS, es);
        m->su = take2(a, N, FS, es);
        m->sh = take2(a, N, FS, es);
        m->sy = take2(a, N, C, 4);
        m->sz = take(a, N, 4);
        m->dsy = take2(a, N, C, es);
        m->dsh = take2(a, N, FS, 4);
        m->dsg = take2(a, N, FS, es);
        m->dsu = take2(a, N, FS, es);
        m->dsz = take(a, N, 4);
    }
    m->dy = take2(a, NK, C, es);
    m->dhh = take2(a, NK, FE, 4);
    m->dhg = take2(a, NK, FE, es);
    m->dhu = take2(a, NK, FE, es);
    m->dxg = take2(a, NK, C, 4);
    m->dwk = take(a, NK, 4);
    m->dz = take2(a, N, E, 4);
    m->gemm_scratch = take(a, mt_cuda_moe_gemm_scratch_bytes((int)E), 1);
    m->cnt = take(a, E, 8);
    m->psum = take(a, E, 8);
}

static void shape(mt_cuda_moe *m, const mt_config *c, size_t N, mt_precision prec) {
    *m = (mt_cuda_moe){.N = N, .C = (size_t)c->C, .E = (size_t)c->moe.E, .K = (size_t)c->moe.K,
                       .FE = (size_t)c->moe.FE, .FS = (size_t)c->moe.FS, .prec = prec,
                       .es = prec == MT_PREC_BF16 ? 2 : 4, .norm_topk = c->moe.norm_topk,
                       .aux_on = c->moe.aux_loss, .aux_coef = c->moe.aux_coef};
}

void mt_cuda_moe_layout(mt_cuda_moe *m, const mt_config *c, size_t N, mt_precision prec,
                        mt_arena *a) {
    shape(m, c, N, prec);
    carve(m, a);
}

size_t mt_cuda_moe_bytes(const mt_config *c, size_t N, mt_precision prec) {
    if (!mt_config_is_moe(c)) return 0;
    mt_cuda_moe m;
    mt_arena a = {0};
    mt_cuda_moe_layout(&m, c, N, prec, &a);
    return a.overflow ? SIZE_MAX : a.used;
}
