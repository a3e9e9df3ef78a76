/* The placement planner: a step-time model over the three streams and the
 * optimizer thread (whose disk tier is planner_disk.c's), and a greedy
 * choice of homes within the budgets; planner_print.c prints the plan. */
#include "plan/planner.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "dist/shard.h"
#include "plan/planner_internal.h"
#include "util/mem.h"
#include "util/sys.h"

/* ---- per-layer compute ---- */

static int probed_for(const mt_rates *r, const mt_config *c, int64_t tokens, int64_t T) {
    return r->layer_fwd_s > 0 && r->probe_C == c->C && r->probe_F == c->F &&
           r->probe_tokens == tokens && r->probe_T == T;
}

/* Seconds of one decoder layer's forward, backward (with its recompute),
 * backward of a kept layer and of a down-kept one (Gemma), the head and
 * the embedding. */
typedef struct layer_costs { double f, b, b_kept, b_down, head, embed; } layer_costs;

/* A Gemma layer's down projection in a probed forward of fwd_s seconds:
 * its share of the products (0 for other blocks, whose recompute skips it
 * anyway). */
static double probed_down_s(const mt_config *c, double fwd_s) {
    if (!mt_arch_is_gemma(c->arch)) return 0;
    double Q = (double)c->NH * c->HD, KV = (double)c->NKV * c->HD, F = (double)c->F;
    return fwd_s * F / (2 * Q + 2 * KV + 3 * F);
}

/* FLOP-rate estimate of one decoder layer, the head and the embedding. The
 * element-wise byte counts per token are those of the bf16 fast path
 * (norms, RoPE, SwiGLU, residual, casts), rounded up. */
static layer_costs costs(const mt_plan_request *q) {
    const mt_config *c = q->cfg;
    const mt_rates *r = &q->rates;
    double tok = (double)q->M * q->B * q->T;
    if (probed_for(r, c, (int64_t)tok, q->T)) {
        double b_down = r->layer_bwd_down_s > 0 ? r->layer_bwd_down_s
                                                : r->layer_bwd_s - probed_down_s(c, r->layer_fwd_s);
        return (layer_costs){r->layer_fwd_s, r->layer_bwd_s, r->layer_bwd_kept_s, b_down,
                             r->head_s * (double)c->V / (double)r->probe_V, r->embed_s};
    }
    double Q = (double)c->NH * c->HD;
    /* parameters one token works with in an average block: the dense
     * block's, or for MoE the attention, router and its top-k experts */
    double outside = (double)c->V * c->C * (c->tie_embeddings ? 1 : 2) + c->C;
    double Pm = ((double)mt_config_active_params(c) - outside) / (double)c->L;
    double Fa = mt_config_is_moe(c) ? (double)c->moe.K * c->moe.FE + c->moe.FS : (double)c->F;
    double G = r->gemm_tflops * 1e12, H = r->hbm_gbs * 1e9;
    double attn = 2.0 * q->T * Q * tok; /* causal: half of 4 * T * Q per token */
    double ew = tok * (24.0 * c->C + 12.0 * Fa + 16.0 * Q);
    layer_costs k;
    k.f = 2 * Pm * tok / G + attn / (r->attn_fwd_tflops * 1e12) + ew / H;
    k.b_kept = 4 * Pm * tok / G + 2.5 * attn / (r->attn_bwd_tflops * 1e12) + 2 * ew / H;
    /* the backward's recompute of a dense block stops before the down
     * projection (its output is not needed), a parallel gpt_neox or falcon
     * block's skips the attention's output product too; an MoE block's
     * recomputes it all (its backward reads the experts' outputs), and so
     * does a Gemma block's (its post-norm's backward reads the down
     * projection's output) */
    double dp = 2.0 * c->F * c->C * tok / G, gemma = mt_arch_is_gemma(c->arch);
    double down = mt_config_is_moe(c) || gemma ? 0 : dp;
    if (mt_arch_has_neox_block(c->arch) && c->parallel_residual) down += 2.0 * Q * c->C * tok / G;
    k.b = k.f - down + k.b_kept;
    k.b_down = gemma ? k.b - dp : k.b; /* a down-kept Gemma layer skips the product */
    k.head = 6.0 * c->V * c->C * tok / G + tok * c->V * 8.0 / H;
    k.embed = tok * c->C * 16.0 / H;
    return k;
}

/* ---- the step-time model ----
 * Replays the bind order of a step (forward 0..L, head, backward L..0)
 * over three resources: the H2D engine (weights, saved input loads), the
 * compute stream, the D2H engine (saved input saves, gradients). A layer's
 * weights start copying once the optimizer thread has updated it and at
 * most K-1 binds ahead; a gradient accumulator is reused only after its
 * drain. The optimizer starts with the step (the last step's drains end
 * it): the device layers' updates first on the compute stream, the CPU's
 * in layer order, each once its gradient is on the host (a GPU-waiting one
 * is fetched while the layer before it is updated; planner_disk.c). */

/* The seconds of one all-gather or reduce-scatter of layer l between the
 * ranks (0 on one GPU): (n-1)/n of its chunks arrive at each GPU at the
 * collectives' bus bandwidth. */

static double collective_s(const mt_plan_request *q, int l) {
    if (q->ranks <= 1) return 0;
    double extent = (double)mt_shard_chunk(q->t->layers[l].numel, q->ranks) * q->ranks;
    return extent * 4.0 * (q->ranks - 1) / q->ranks / (q->rates.link_gbs * 1e9);
}


/* Whether saved input l leaves the GPU between its passes (host or disk). */
static int moved(const mt_layer_home *h, int l) { return h[l].saved_host || h[l].saved_disk; }

/* The replay's state: when each resource is next free, how long each was
 * busy, and what every bind reads of the request and the plan. */
typedef struct replay {
    const mt_plan_request *q;
    const mt_plan *plan;
    layer_costs k;
    int K, head;
    double h2d, d2h, ck;         /* bytes/s each way; a host-saved input's bytes */
    double h2d_free, comp, d2h_free, coll_free;
    double h2d_busy, d2h_busy, coll_busy, compute;
    double drained[2];           /* the two host-gradient accumulators' last drains */
    int gturn;                   /* the accumulator the next host gradient takes */
    double *cstart, *opt_done;   /* each bind's compute start; each layer's update */
    mt_saved_disk_sim sd;
} replay;

/* Whether backward layer l rebuilds its input from saved input l-1. */
static int rebuilds(const replay *s, int l, int back) {
    return back && l >= 1 && l < s->head - 1 && s->plan->homes[l].saved_recompute;
}

/* Layer l's collective on the collectives' stream, not before t: when it
 * ends. */
static double collective(replay *s, int l, double t) {
    double c = collective_s(s->q, l);
    s->coll_free = fmax(s->coll_free, t) + c;
    s->coll_busy += c;
    return s->coll_free;
}

/* Bind j (layer l after layer prev, b: of the backward) on the H2D engine
 * (and the collectives' stream): its weights once per pass, the last block
 * resident at the turn, device layers bound in place on one GPU and
 * all-gathered from the GPU on several; then the input it loads, or the one
 * its rebuilt input comes from (then not again for that layer), a disk one
 * once its read is in. Returns when the layer is ready to compute. */
static double upload(replay *s, int j, int l, int prev, int b) {
    const mt_plan_request *q = s->q;
    const mt_plan *plan = s->plan;
    const mt_layer_home *h = plan->homes;
    int nl = q->t->n_layers, head = s->head, back = b && l != head;
    double rh2d = back ? s->h2d * q->rates.duplex : s->h2d;
    int resident = prev == l || (back && l == head - 1);
    /* 4 bytes a parameter, 2 where the weights are on disk (their bf16 copy) */
    double wbytes = resident || l < plan->n_dev
                        ? 0
                        : mt_plan_part_floats(q, l) * (l >= nl - plan->n_disk_w ? 2 : 4);
    double ready = j >= s->K - 1 ? s->cstart[j - (s->K - 1)] : 0;
    if (!b) ready = fmax(ready, s->opt_done[l]);
    double st = fmax(s->h2d_free, ready), e = st + wbytes / rh2d;
    s->h2d_busy += wbytes / rh2d;
    int rebuild = rebuilds(s, l, back);
    int load = back && l >= 1 && l < head - 1 &&
               ((moved(h, l) && !h[l + 1].saved_recompute) ||
                (rebuild && l >= 2 && moved(h, l - 1)));
    int from_disk = load && h[rebuild ? l - 1 : l].saved_disk;
    if (from_disk) e = mt_saved_disk_sim_read_ready(&s->sd, e);
    if (load) {
        e += s->ck / rh2d;
        s->h2d_busy += s->ck / rh2d;
    }
    if (from_disk) mt_saved_disk_sim_loaded(&s->sd, e);
    s->h2d_free = e;
    if (q->ranks > 1 && !resident) /* the other ranks' parts */
        return fmax(e, collective(s, l, st + wbytes / rh2d));
    return e;
}

/* Seconds of layer l's pass (b: its backward, with a rebuilt input's
 * forward). */
static double pass_s(const replay *s, int l, int b) {
    const layer_costs *k = &s->k;
    int first_kept = s->head - s->plan->n_keep; /* decoder layers >= this keep activations */
    int first_down = first_kept - s->plan->n_keep_down; /* >= this: their down output */
    if (l == s->head) return k->head;
    if (l == 0) return k->embed;
    if (!b) return k->f;
    return (l >= first_kept ? k->b_kept : l >= first_down ? k->b_down : k->b) +
           (rebuilds(s, l, 1) ? (l == 1 ? k->embed : k->f) : 0);
}

/* Forward layer l's output leaves for the host (or the disk). */
static void save_output(replay *s, int l) {
    const mt_layer_home *h = s->plan->homes;
    double ds = fmax(s->d2h_free, s->comp);
    if (h[l + 1].saved_disk) ds = mt_saved_disk_sim_stage(&s->sd, ds);
    s->d2h_free = ds + s->ck / s->d2h;
    s->d2h_busy += s->ck / s->d2h;
    if (h[l + 1].saved_disk) mt_saved_disk_sim_write(&s->sd, s->d2h_free);
}

/* Backward layer l's gradient, summed over the ranks, drains to its host
 * accumulator unless it waits on the GPU. */
static void gradient_out(replay *s, int l) {
    const mt_plan_request *q = s->q;
    double rd2h = l != s->head ? s->d2h * q->rates.duplex : s->d2h;
    double done = q->ranks > 1 ? collective(s, l, s->comp) : s->comp;
    if (!s->plan->homes[l].grad_host) return;
    double bytes = mt_plan_part_floats(q, l) * (s->plan->host_grad_bf16 ? 2 : 4);
    double ds = fmax(s->d2h_free, done);
    s->d2h_free = ds + bytes / rd2h;
    s->d2h_busy += bytes / rd2h;
    s->drained[s->gturn] = s->d2h_free;
    s->gturn ^= 1;
}

mt_step_prediction mt_plan_predict(const mt_plan_request *q, const mt_plan *plan) {
    const mt_rates *r = &q->rates;
    int nl = q->t->n_layers, head = nl - 1;
    double tok = (double)q->M * q->B * q->T;
    replay s = {.q = q, .plan = plan, .k = costs(q), .K = q->slots > 1 ? q->slots : 3,
                .head = head, .h2d = r->h2d_gbs * 1e9, .d2h = r->d2h_gbs * 1e9,
                .ck = tok * q->cfg->C * (q->saved_bf16 ? 2.0 : 4.0)};
    if (plan->lean_keep) /* the kept layers' backward rebuilds x + o_proj(att) */
        s.k.b_kept += 2.0 * q->cfg->NH * q->cfg->HD * q->cfg->C * tok / (r->gemm_tflops * 1e12);
    int seq[2 * 4096 + 2], bwd[2 * 4096 + 2], n = 0;
    for (int l = 0; l < nl; l++) seq[n] = l, bwd[n++] = l == head;
    for (int l = head - 1; l >= 0; l--) seq[n] = l, bwd[n++] = 1;
    s.cstart = mt_calloc_or_die((size_t)n, sizeof *s.cstart);
    s.opt_done = mt_calloc_or_die((size_t)nl, sizeof *s.opt_done);
    double disk_end = 0, disk_busy = 0, fwd_end = 0;
    mt_disk_spans adam_spans = {0};
    double opt = mt_plan_optimizer_times(q, plan, 0, s.opt_done, &disk_end, &disk_busy,
                                         &adam_spans);
    mt_saved_disk_sim_init(&s.sd, q, plan, &adam_spans);
    /* the device layers' AdamW on the compute stream first */
    for (int l = 0; l < plan->n_dev; l++)
        s.comp += mt_plan_part_floats(q, l) * 30.0 / (r->hbm_gbs * 1e9);
    s.compute = s.comp;
    for (int j = 0; j < n; j++) {
        int l = seq[j], b = bwd[j];
        double c0 = fmax(s.comp, upload(&s, j, l, j > 0 ? seq[j - 1] : -1, b));
        if (b && plan->homes[l].grad_host) c0 = fmax(c0, s.drained[s.gturn]); /* reuse */
        double dur = pass_s(&s, l, b);
        s.cstart[j] = c0;
        s.comp = c0 + dur;
        s.compute += dur;
        if (!b && l >= 1 && l < head && moved(plan->homes, l + 1)) save_output(&s, l);
        if (l == head) fwd_end = c0; /* the head belongs to neither pass in the report */
        if (l == head && b) mt_saved_disk_sim_backward(&s.sd, c0);
        if (b) gradient_out(&s, l);
    }
    mt_step_prediction p = {.fwd = fwd_end, .bwd = s.comp - fwd_end, .opt = opt,
                            .h2d_busy = s.h2d_busy, .d2h_busy = s.d2h_busy,
                            .compute = s.compute, .coll_busy = s.coll_busy,
                            .disk_busy = disk_busy + s.sd.busy, .disk_saved_busy = s.sd.busy};
    /* the disk's traffic of a step cannot take longer than the step: each
     * tier's on its own channel, and both together on the same drives */
    p.step = fmax(fmax(fmax(s.comp, s.d2h_free), s.coll_free), fmax(disk_end, s.sd.free_at));
    p.step = fmax(p.step, p.disk_busy);
    mt_saved_disk_sim_free(&s.sd);
    free(adam_spans.at);
    free(s.cstart);
    free(s.opt_done);
    return p;
}

/* ---- sizes ---- */

void mt_plan_backend_opts(const mt_plan *plan, const mt_plan_request *q,
                          mt_cuda_backend_opts *o) {
    *o = (mt_cuda_backend_opts){.precision = q->precision, .slots = q->slots,
                                .homes = plan->homes, .host_grad_bf16 = plan->host_grad_bf16,
                                .host_saved_bf16 = q->saved_bf16,
                                .saved_disk_dirs = q->disk_dirs,
                                .keep_layers = plan->n_keep,
                                .gpu_budget = (size_t)q->gpu_budget,
                                .device_optim_layers = plan->n_dev,
                                .lean_keep = plan->lean_keep,
                                .keep_down_layers = plan->n_keep_down, .rank = q->rank,
                                .ranks = q->ranks};
}

/* Floats of this rank's part of the store (the whole model on one GPU). */
static double store_floats(const mt_plan_request *q) {
    if (q->ranks <= 1) return (double)q->t->total;
    double n = 0;
    for (int l = 0; l < q->t->n_layers; l++) {
        mt_shard_range r = mt_shard_split(q->t->layers[l].numel, q->ranks, q->rank);
        n += (double)(r.end - r.begin);
    }
    return n;
}

static void measure(const mt_plan_request *q, mt_plan *p) {
    /* a kept layer needs no down-kept unit: those are the layers before */
    if (p->n_keep + p->n_keep_down > (int)q->cfg->L) p->n_keep_down = (int)q->cfg->L - p->n_keep;
    mt_cuda_backend_opts o;
    mt_plan_backend_opts(p, q, &o);
    double tok = (double)q->M * q->B * q->T;
    p->gpu_bytes = (double)mt_cuda_backend_bytes(q->cfg, q->t, q->M, q->B, q->T, &o) +
                   (double)MT_CUDA_CONTEXT_RESERVE;
    p->pinned_bytes = (double)mt_cuda_backend_host_bytes(q->cfg, q->t, q->M, q->B, q->T, &o);
    p->store_bytes = store_floats(q) * 12.0;
    double freed = 0;
    p->disk_bytes = 0;
    if (p->n_disk) mt_plan_disk_sizes(q, p->n_disk, p->n_disk_w, &p->disk_bytes, &freed);
    p->n_disk_saved = 0;
    for (int l = 1; l < p->n_layers; l++) p->n_disk_saved += p->homes[l].saved_disk;
    p->disk_saved_bytes = p->n_disk_saved * mt_plan_saved_block_bytes(q);
    p->store_bytes -= freed;
    /* tokens, targets and the embedding plan of a step, in the trainer and the backend */
    p->host_bytes = p->store_bytes + p->pinned_bytes + tok * 20.0;
    p->n_host_grads = p->n_host_saved = 0;
    for (int l = 0; l < p->n_layers; l++) {
        p->n_host_grads += p->homes[l].grad_host;
        p->n_host_saved += l >= 1 && p->homes[l].saved_host;
    }
}

double mt_plan_default_host_budget(void) { return mt_host_ram_budget_bytes(); }

/* ---- the choice ---- */

/* Decoder layers in the order their gradients move to the GPU: the first
 * the next forward needs first. The embedding and the head come last: a
 * GPU-waiting layer sizes the optimizer's pinned staging buffers. */
static int grad_order(const mt_param_table *t, int i) {
    int L = t->n_layers - 2;
    if (i < L) return 1 + i;
    return i == L ? 0 : t->n_layers - 1;
}

/* The first saved input on the host, 0 if none. */
static int first_host_saved(const mt_plan *p) {
    for (int l = 1; l < p->n_layers; l++)
        if (p->homes[l].saved_host) return l;
    return 0;
}

/* The first saved input on the host (host 1) or the GPU (host 0) that can
 * be rebuilt in the backward instead: neither neighbour is rebuilt (each
 * is rebuilt from the one before). 0 if none. */
static int rebuildable_saved(const mt_plan *p, int host) {
    const mt_layer_home *h = p->homes;
    for (int l = 2; l < p->n_layers - 2; l++)
        if (!h[l].saved_recompute && !h[l].saved_disk && h[l].saved_host == host &&
            !h[l - 1].saved_recompute && !h[l + 1].saved_recompute)
            return l;
    return 0;
}

/* Moves the first host-saved input (in layer order) to disk; 0 if none. */
static int saved_to_disk(mt_plan *p) {
    int l = first_host_saved(p);
    if (l > 0) p->homes[l].saved_host = 0, p->homes[l].saved_disk = 1;
    return l;
}

/* The placement to start from: every gradient and saved input on the host
 * (all on the GPU with all_gpu), except that layer 1's input is rebuilt
 * from the tokens (an embedding lookup) and the last block's and the
 * head's never leave the GPU between their forward and backward; the
 * device layers, disk layers and disk-saved inputs asked for. */
static void start_homes(const mt_plan_request *q, mt_plan *p, int bf16, int lean) {
    int nl = q->t->n_layers;
    p->host_grad_bf16 = bf16;
    p->n_keep = p->n_keep_down = 0;
    p->lean_keep = lean;
    for (int l = 0; l < nl; l++)
        p->homes[l] = (mt_layer_home){.grad_host = 1, .saved_host = l >= 2 && l < nl - 2,
                                      .saved_recompute = l == 1 || l >= nl - 2};
    if (q->all_gpu)
        for (int l = 0; l < nl; l++) p->homes[l] = (mt_layer_home){0};
    /* device layers asked for (the planner's choice adds them later, from
     * none); their gradients wait on the GPU */
    p->n_disk = q->disk_layers > 0 ? (q->disk_layers < nl ? q->disk_layers : nl) : 0;
    p->n_disk_w = q->disk_weight_layers > 0 ? q->disk_weight_layers : 0; /* < nl: checked */
    if (p->n_disk < p->n_disk_w) p->n_disk = p->n_disk_w;
    p->n_dev = q->device_optim > 0 ? (q->device_optim < nl - 1 ? q->device_optim : nl - 1) : 0;
    if (p->n_dev > nl - p->n_disk) p->n_dev = nl - p->n_disk; /* disk layers: the CPU's */
    for (int l = 0; l < p->n_dev; l++) p->homes[l].grad_host = 0;
    for (int k = 0; !q->all_gpu && k < q->disk_saved_layers; k++)
        if (!saved_to_disk(p)) break;
    measure(q, p);
}

/* Host short: saved inputs to the GPU while it has room (a GB of GPU frees
 * a GB of host), then (rebuild) saved inputs rebuilt in the backward from
 * the previous layer's (a layer forward each), then gradients to the GPU
 * in the order the next forward needs them, rebuilding GPU saved inputs to
 * make room for them; then (disk) the saved inputs left on the host to
 * disk, the first ones first, as few as fit (each moves its bytes twice,
 * hidden behind the passes' compute), then the m and v of the last layers,
 * the fewest that fit (16 bytes a parameter between the backward and the
 * next forward). */
static void fit_host(const mt_plan_request *q, mt_plan *p, int rebuild, int disk) {
    int nl = q->t->n_layers, gi = 0;
    while (!q->all_gpu && p->host_bytes > q->host_budget) {
        int ci = first_host_saved(p);
        if (ci > 0) {
            p->homes[ci].saved_host = 0;
            measure(q, p);
            if (p->gpu_bytes <= q->gpu_budget) continue;
            p->homes[ci].saved_host = 1;
            measure(q, p);
        }
        int di = rebuild ? rebuildable_saved(p, 1) : 0;
        if (di > 0) {
            p->homes[di] = (mt_layer_home){.grad_host = p->homes[di].grad_host,
                                           .saved_recompute = 1};
            measure(q, p);
            continue;
        }
        if (gi >= nl) break;
        mt_layer_home *g = &p->homes[grad_order(q->t, gi)];
        g->grad_host = 0;
        measure(q, p);
        if (p->gpu_bytes <= q->gpu_budget) {
            gi++;
            continue;
        }
        g->grad_host = 1;
        /* the GPU is full of saved inputs: rebuild one to make room */
        int gd = rebuild ? rebuildable_saved(p, 0) : 0;
        if (gd > 0) p->homes[gd].saved_recompute = 1;
        measure(q, p);
        if (gd <= 0) break;
    }
    while (disk && q->disk_saved_layers < 0 && q->ranks <= 1 && p->host_bytes > q->host_budget &&
           saved_to_disk(p))
        measure(q, p);
    while (disk && q->disk_layers < 0 && p->host_bytes > q->host_budget &&
           p->n_disk < nl - p->n_dev) {
        p->n_disk++;
        measure(q, p);
    }
    /* every allowed layer's m and v on disk and RAM still short: the
     * weights of the last ones too (12 bytes a parameter moved each step
     * instead of 8, half the H2D) */
    while (disk && q->disk_weight_layers < 0 && mt_plan_disk_weights_allowed(q) &&
           p->n_disk == nl - p->n_dev && p->host_bytes > q->host_budget &&
           p->n_disk_w < mt_plan_disk_weights_most(p)) {
        p->n_disk_w++;
        measure(q, p);
    }
}

/* Why a placement that does not fit does not: which budget, by how much,
 * the cheapest change. */
static void refusal(const mt_plan_request *q, mt_plan *p, int bf16) {
    if (p->disk_bytes + p->disk_saved_bytes > q->disk_budget &&
        (p->n_disk || p->n_disk_saved)) {
        snprintf(p->why, sizeof p->why,
                 "the disk budget is short: the Adam m and v of the last %d layers and %d saved "
                 "layer inputs take %.1f GB on disk, the budget is %.1f GB; free space, add "
                 "drives (--nvme-dir A,B), raise --disk-mem, or a larger --host-mem", p->n_disk,
                 p->n_disk_saved, (p->disk_bytes + p->disk_saved_bytes) / 1e9,
                 q->disk_budget / 1e9);
        return;
    }
    int no_disk = q->disk_budget <= 0;
    char less[96] = "";
    if (p->n_disk_w)
        snprintf(less, sizeof less, " less the disk's (m and v of %d layers, the fp32 weights of "
                 "%d, a bf16 copy in RAM)", p->n_disk, p->n_disk_w);
    else if (p->n_disk)
        snprintf(less, sizeof less, " less the disk's");
    snprintf(p->why, sizeof p->why,
             "the two budgets together are short: host needs %.1f GB of %.1f GB with %.1f "
             "GB of %.1f GB on the GPU (store %.1f GB = 12 bytes/param%s, saved inputs %.2f "
             "GB per layer, gradients %d bytes/param on the host); use fewer tokens per "
             "step (saved inputs scale with them), or a larger --gpu-mem or --host-mem%s%s%s",
             p->host_bytes / 1e9, q->host_budget / 1e9, p->gpu_bytes / 1e9,
             q->gpu_budget / 1e9, p->store_bytes / 1e9, less,
             (double)q->M * q->B * q->T * q->cfg->C * (q->saved_bf16 ? 2 : 4) / 1e9,
             bf16 ? 2 : 4, bf16 ? "" : ", or --host-grad-dtype bf16",
             q->saved_bf16 || q->precision != MT_GPU_BF16 ? "" : ", or --saved-input-dtype bf16",
             !no_disk ? "" : q->ranks > 1 ? ", or the disk tier for the optimizer state "
                                           "(--nvme-dir)"
                                         : ", or the disk tier for the optimizer state and "
                                           "saved inputs (--nvme-dir)");
}

/* The rest of the GPU buys speed: saved inputs home (no PCIe traffic),
 * kept layers (no recompute), gradients home, the next leading layer's
 * optimizer on the GPU (its copies leave the step's start), and for Gemma
 * one more layer's down projection output (a quarter of a recompute's
 * products for a ninth of a kept layer's bytes), by the model's gain per
 * byte. */
static void spend_gpu(const mt_plan_request *q, mt_plan *p) {
    const mt_param_table *t = q->t;
    int nl = t->n_layers, L = nl - 2;
    /* MoE blocks always recompute (backend/cuda/moe_cuda.c) */
    int keep_ok = q->precision == MT_GPU_BF16 && q->keep_layers != 0 && !mt_config_is_moe(q->cfg);
    for (;;) {
        mt_step_prediction base = mt_plan_predict(q, p);
        double best_gain = 0;
        /* 0 saved input, 1 keep, 2 gradient, 3 rebuilt one, 4 device layer, 5 down kept */
        int best = -1;
        int ck = 1;
        while (ck < nl && !p->homes[ck].saved_host) ck++;
        int gk = 0;
        while (gk < nl && !p->homes[grad_order(t, gk)].grad_host) gk++;
        int rk = 2; /* a rebuilt saved input kept on the GPU instead (not layer 1's) */
        while (rk < nl - 2 && !p->homes[rk].saved_recompute) rk++;
        for (int m = 0; m < 6; m++) {
            int ok = m == 0   ? ck < nl
                     : m == 1 ? keep_ok && p->n_keep < L &&
                                    (q->keep_layers < 0 || p->n_keep < q->keep_layers)
                     : m == 2 ? gk < nl
                     : m == 3 ? rk < nl - 2
                     : m == 4 ? q->device_optim < 0 && p->n_dev < nl - 1 &&
                                    p->n_dev < nl - p->n_disk /* disk layers: the CPU's */
                              : keep_ok && mt_arch_is_gemma(q->cfg->arch) &&
                                    p->n_keep + p->n_keep_down < L;
            if (!ok) continue;
            mt_plan trial = *p;
            trial.homes = mt_calloc_or_die((size_t)nl, sizeof *trial.homes);
            memcpy(trial.homes, p->homes, (size_t)nl * sizeof *trial.homes);
            if (m == 0) trial.homes[ck].saved_host = 0;
            if (m == 1) trial.n_keep++;
            if (m == 2) trial.homes[grad_order(t, gk)].grad_host = 0;
            if (m == 3) trial.homes[rk].saved_recompute = 0;
            if (m == 4) trial.homes[trial.n_dev++].grad_host = 0;
            if (m == 5) trial.n_keep_down++;
            measure(q, &trial);
            /* a GPU-waiting gradient pins the optimizer's staging on the host */
            if (trial.gpu_bytes <= q->gpu_budget && trial.host_bytes <= q->host_budget) {
                mt_step_prediction s = mt_plan_predict(q, &trial);
                double gain = (base.step - s.step) / fmax(trial.gpu_bytes - p->gpu_bytes, 1.0);
                /* ties (no predicted gain) still bring saved inputs home: less traffic */
                if (m == 0 && base.step - s.step <= 0) gain = 1e-15;
                if (gain > best_gain) best_gain = gain, best = m;
            }
            free(trial.homes);
        }
        if (best < 0) break;
        if (best == 0) p->homes[ck].saved_host = 0;
        if (best == 1) p->n_keep++;
        if (best == 2) p->homes[grad_order(t, gk)].grad_host = 0;
        if (best == 3) p->homes[rk].saved_recompute = 0;
        if (best == 4) p->homes[p->n_dev++].grad_host = 0;
        if (best == 5) p->n_keep_down++;
        measure(q, p);
    }
}

static int try_dtype(const mt_plan_request *q, mt_plan *p, int bf16, int rebuild, int disk,
                     int lean) {
    start_homes(q, p, bf16, lean);
    if (p->gpu_bytes > q->gpu_budget) {
        snprintf(p->why, sizeof p->why,
                 "GPU budget short by %.1f GB: with every gradient and saved input on the host "
                 "the GPU still needs %.1f GB of %.1f GB (weight slots, one layer's "
                 "activations for %lld tokens); use fewer rows per micro-batch (--batch-size) "
                 "and more micro-batches, or a shorter --seq-len",
                 (p->gpu_bytes - q->gpu_budget) / 1e9, p->gpu_bytes / 1e9, q->gpu_budget / 1e9,
                 (long long)(q->B * q->T));
        return 0;
    }
    fit_host(q, p, rebuild, disk);
    if (p->host_bytes > q->host_budget || p->gpu_bytes > q->gpu_budget ||
        ((p->n_disk || p->n_disk_saved) && p->disk_bytes + p->disk_saved_bytes > q->disk_budget)) {
        refusal(q, p, bf16);
        return 0;
    }
    spend_gpu(q, p);
    p->pred = mt_plan_predict(q, p);
    p->fits = 1;
    return 1;
}

/* A plan to try beside p: its settings, homes of its own, not fitting
 * until a try_* says so. */
static mt_plan trial_of(const mt_plan *p) {
    mt_plan t = *p;
    t.homes = mt_calloc_or_die((size_t)p->n_layers, sizeof *t.homes);
    t.fits = 0;
    return t;
}

/* p becomes trial when trial fits and p does not or trial is faster; the
 * other's homes are freed. 1 if trial was kept. */
static int keep_faster(mt_plan *p, mt_plan *trial) {
    if (trial->fits && (!p->fits || trial->pred.step < p->pred.step)) {
        free(p->homes);
        *p = *trial;
        return 1;
    }
    free(trial->homes);
    return 0;
}

/* try_dtype with full kept units, and, when layers can be kept, with lean
 * ones (more of them fit, each rebuilding its mid-block residual): the
 * faster of the two. */
static int try_units(const mt_plan_request *q, mt_plan *p, int bf16, int rebuild, int disk) {
    if (!try_dtype(q, p, bf16, rebuild, disk, 0)) return 0;
    if (q->precision != MT_GPU_BF16 || q->keep_layers == 0 || mt_config_is_moe(q->cfg))
        return 1;
    /* gpt_neox's, falcon's and Gemma's units have no lean form: what they
     * keep follows their residuals (backend/cuda/neox_cuda.c, gemma_cuda.c) */
    if (mt_arch_has_neox_block(q->cfg->arch) || mt_arch_is_gemma(q->cfg->arch)) return 1;
    mt_plan lean = trial_of(p);
    try_dtype(q, &lean, bf16, rebuild, disk, 1);
    keep_faster(p, &lean);
    return 1;
}

/* With p a fitting plan with rebuilt saved inputs allowed: the plan
 * without them instead when it fits too and is faster. */
static void faster_without_rebuild(const mt_plan_request *q, mt_plan *p, int bf16) {
    mt_plan other = trial_of(p);
    try_units(q, &other, bf16, 0, 1);
    keep_faster(p, &other);
}

/* With p a fitting plan whose saved inputs on disk the planner chose (the
 * fewest that fit): more of them instead, each count in turn, when that is
 * faster (a disk one frees its RAM for fewer rebuilt saved inputs, fewer
 * layers' Adam state on disk); the fastest count that fits. */
static void faster_with_more_saved_on_disk(const mt_plan_request *q, mt_plan *p, int bf16) {
    if (q->disk_saved_layers >= 0 || !p->n_disk_saved) return;
    mt_plan_request r = *q;
    for (int k = p->n_disk_saved + 1; k < p->n_layers; k++) {
        r.disk_saved_layers = k;
        mt_plan trial = trial_of(p);
        int ok = try_units(&r, &trial, bf16, 1, 1);
        if (ok) faster_without_rebuild(&r, &trial, bf16);
        if (!ok || trial.n_disk_saved < k) { /* no room, or no saved input left to move */
            free(trial.homes);
            return;
        }
        keep_faster(p, &trial);
    }
}

void mt_plan_place(const mt_plan_request *q, mt_plan *p) {
    memset(p, 0, sizeof *p);
    p->n_layers = q->t->n_layers;
    p->homes = mt_calloc_or_die((size_t)p->n_layers, sizeof *p->homes);
    /* fp32 host gradients when they fit; rebuilt saved inputs (a layer
     * forward each) only when neither dtype fits without them */
    for (int rebuild = 0; rebuild < 2; rebuild++) {
        if (q->host_grad_dtype != 1 && try_units(q, p, 0, rebuild, 0)) return;
        if (q->host_grad_dtype != 0 && try_units(q, p, 1, rebuild, 0)) return;
    }
    /* saved inputs, then the optimizer state of the last layers on disk (a
     * read and a write of 8 bytes a parameter each step) only when nothing
     * fits without them:
     * fp32 or bf16 host gradients (bf16 needs fewer disk layers), with or
     * without rebuilt saved inputs (which need fewer too), with the fewest
     * saved inputs on disk or more, whichever is fastest */
    if ((q->disk_layers < 0 || q->disk_saved_layers < 0 || q->disk_weight_layers < 0) &&
        q->disk_budget > 0)
        for (int bf16 = 0; bf16 < 2; bf16++) {
            if (q->host_grad_dtype >= 0 && bf16 != q->host_grad_dtype) continue;
            mt_plan trial = trial_of(p);
            if (try_units(q, &trial, bf16, 1, 1)) {
                faster_without_rebuild(q, &trial, bf16);
                faster_with_more_saved_on_disk(q, &trial, bf16);
            }
            if (!keep_faster(p, &trial) && !p->fits) memcpy(p->why, trial.why, sizeof p->why);
        }
}

/* The first step shape that fits, appended to p->why as the options that
 * give it: the same tokens in smaller micro-batches (less GPU memory for
 * activations), then fewer micro-batches, then smaller ones (fewer
 * checkpoints on the host). */
/* The same step with bf16 saved inputs, appended to p->why when it fits
 * (a bf16 run whose saved inputs are fp32); 1 if it was. */
static int suggest_saved_bf16(const mt_plan_request *q, mt_plan *p) {
    if (q->saved_bf16 || q->precision != MT_GPU_BF16) return 0;
    mt_plan_request r = *q;
    r.saved_bf16 = 1;
    mt_plan t;
    mt_plan_place(&r, &t);
    int fits = t.fits;
    if (fits) {
        size_t len = strlen(p->why);
        snprintf(p->why + len, sizeof p->why - len, "; --saved-input-dtype bf16 fits (the same "
                 "%lld tokens a step, predicted at %.2f s a step)",
                 (long long)q->M * q->B * q->T, t.pred.step);
    }
    mt_plan_free(&t);
    return fits;
}

static void suggest(const mt_plan_request *q, mt_plan *p) {
    if (suggest_saved_bf16(q, p)) return;
    int64_t cand[40][2]; /* {B, M} */
    int n = 0;
    for (int64_t b = q->B / 2, m = (int64_t)q->M * 2; b >= 1 && m <= 4096 && n < 40; b /= 2, m *= 2)
        if (q->B % b == 0) cand[n][0] = b, cand[n++][1] = m;
    for (int64_t m = q->M / 2; m >= 1 && n < 40; m /= 2) cand[n][0] = q->B, cand[n++][1] = m;
    for (int64_t b = q->B / 2; b >= 1 && n < 40; b /= 2) cand[n][0] = b, cand[n++][1] = 1;
    int ranks = q->ranks > 1 ? q->ranks : 1; /* the option counts every GPU's micro-batches */
    for (int i = 0; i < n; i++) {
        mt_plan_request r = *q;
        r.B = cand[i][0], r.M = (int)cand[i][1];
        mt_plan t;
        mt_plan_place(&r, &t);
        if (t.fits) {
            size_t len = strlen(p->why);
            char opts[96] = "";
            if (r.B != q->B) snprintf(opts, sizeof opts, "--batch-size %lld ", (long long)r.B);
            if (r.M != q->M)
                snprintf(opts + strlen(opts), sizeof opts - strlen(opts), "--micro-batches %lld ",
                         (long long)r.M * ranks);
            snprintf(p->why + len, sizeof p->why - len, "; %sfits (%lld tokens a step%s, "
                     "predicted at %.2f s a step)", opts, (long long)(r.M * r.B * r.T),
                     ranks > 1 ? " a GPU" : "", t.pred.step);
            mt_plan_free(&t);
            return;
        }
        mt_plan_free(&t);
    }
    size_t len = strlen(p->why);
    snprintf(p->why + len, sizeof p->why - len, "; no smaller step (down to --batch-size 1 "
             "--micro-batches %d) fits these budgets", ranks);
}

/* Refusals of --disk-weight-layers N > 0, naming why. */
static int check_disk_weights(const mt_plan_request *q, mt_error *err) {
    int n = q->disk_weight_layers, nl = q->t->n_layers;
    if (q->ranks > 1)
        return mt_errorf(err, "--disk-weight-layers %d: weights on disk are for one GPU; with "
                         "several (--gpus %d) each rank holds only its part of every layer: "
                         "leave it out (the Adam state's disk tier, --disk-layers, works there)",
                         n, q->ranks);
    if (q->precision != MT_GPU_BF16)
        return mt_errorf(err, "--disk-weight-layers %d: weights on disk keep a bf16 copy in RAM "
                         "for the GPU, which an fp32 run (--precision fp32) cannot compute "
                         "with; use --precision bf16 or leave it out", n);
    if (n > nl - 1 || (q->device_optim > 0 && n > nl - q->device_optim))
        return mt_errorf(err, "--disk-weight-layers %d: at most %d of this model's %d layers "
                         "(the embedding's lookup reads fp32 weights, and the layers whose "
                         "AdamW runs on the GPU keep theirs there)", n,
                         nl - (q->device_optim > 1 ? q->device_optim : 1), nl);
    return 0;
}

int mt_plan_make(const mt_plan_request *q, mt_plan *p, mt_error *err) {
    if (q->t->n_layers > 4096)
        return mt_errorf(err, "the planner handles at most 4096 layers (%d)", q->t->n_layers);
    memset(p, 0, sizeof *p); /* mt_plan_free is safe on every return */
    if (q->saved_bf16 && q->precision != MT_GPU_BF16)
        return mt_errorf(err, "bf16 saved inputs (--saved-input-dtype bf16) are for bf16 runs; "
                         "use --precision bf16, or fp32 saved inputs");
    /* the ranks of several GPUs have not run with saved inputs on disk */
    if (q->ranks > 1 && q->disk_saved_layers > 0)
        return mt_errorf(err, "--disk-saved-layers %d: saved layer inputs on disk are not "
                         "supported with several GPUs (--gpus %d) yet; leave it out (the Adam "
                         "state's disk tier, --disk-layers, works there)",
                         q->disk_saved_layers, q->ranks);
    if (q->disk_weight_layers > 0 && check_disk_weights(q, err)) return -1;
    mt_plan_place(q, p);
    if (!p->fits) suggest(q, p);
    return 0;
}

void mt_plan_free(mt_plan *p) {
    free(p->homes);
    p->homes = NULL;
}
