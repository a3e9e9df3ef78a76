/* The plan as `megatrain plan` and the runs print it: each layer's homes,
 * the budgets' use, the disk tier, the predicted step and what bounds it. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "host/disk_state.h"
#include "plan/planner_internal.h"
#include "util/mem.h"

/* What the print groups layers by: homes and whether activations are kept
 * (4), or the down projection's output (64). */
static int layer_kind(const mt_plan *p, int l) {
    int head = p->n_layers - 1;
    if (l == 0) return -1;
    int kept = l < head && l >= head - p->n_keep;
    int down = !kept && l < head && l >= head - p->n_keep - p->n_keep_down;
    return p->homes[l].grad_host | p->homes[l].saved_host << 1 | kept << 2 | (l == head) << 3 |
           p->homes[l].saved_recompute << 4 | p->homes[l].saved_disk << 5 | down << 6;
}

/* The disk tier's rates, as the plan's lines of it end. */
static void disk_rates_text(const mt_plan_request *q, char *out, size_t n) {
    const mt_rates *r = &q->rates;
    double rd, wr, both;
    mt_plan_disk_rates(r, &rd, &wr, &both);
    char at_once[48] = "", shared[96] = "";
    if (both > 0) snprintf(at_once, sizeof at_once, ", both at once %.2f GB/s", both / 1e9);
    if (q->disk_sharers > 1)
        snprintf(shared, sizeof shared, "; shared by the %d ranks of a machine", q->disk_sharers);
    snprintf(out, n, "read %.2f GB/s, write %.2f GB/s%s%s%s", rd / 1e9, wr / 1e9, at_once,
             shared, r->disk_read_gbs > 0 ? "" : ", assumed: measure them with megatrain "
             "calibrate --nvme-dir");
}

/* The weights on disk: which layers, what RAM keeps of them, and the
 * staging, which the largest [w | m | v] block sizes and which can take
 * more RAM than the weights leave. */
static void print_disk_weights(const mt_plan *p, const mt_plan_request *q, FILE *f) {
    int nl = p->n_layers;
    double params = 0, most = 0;
    for (int l = nl - p->n_disk_w; l < nl; l++) {
        params += mt_plan_part_floats(q, l);
        most = fmax(most, mt_plan_part_floats(q, l) * 12.0);
    }
    double mv_most = 0;
    for (int l = nl - p->n_disk; l < nl - p->n_disk_w; l++)
        mv_most = fmax(mv_most, mt_plan_part_floats(q, l) * 8.0);
    char range[32];
    snprintf(range, sizeof range, p->n_disk_w > 1 ? "%d-%d" : "%d", nl - p->n_disk_w, nl - 1);
    /* the staging grows from the largest [m | v] block to the largest [w | m | v] */
    double grown = MT_DISK_STAGING_BUFFERS * fmax(0, most - fmax(mv_most, most * 8 / 12));
    fprintf(f, "disk: the fp32 weights of layers %s too ([w | m | v], 12 bytes a parameter "
            "read and written each step); RAM keeps a bf16 copy (2 bytes a parameter, %.2f GB, "
            "uploaded at half the bytes) and their norms, biases and routers in fp32; staging "
            "%d x %.2f GB (the largest block, %.2f GB more than m and v alone%s)\n", range,
            params * 2.0 / 1e9, MT_DISK_STAGING_BUFFERS, fmax(most, mv_most) / 1e9, grown / 1e9,
            grown > params * 2.0 ? ": more than the weights on disk free" : "");
}

/* The disk tier's layers, bytes and rates: a line for the Adam state's,
 * one for the weights', one for the saved inputs'. */
static void print_disk(const mt_plan *p, const mt_plan_request *q, FILE *f) {
    int nl = p->n_layers;
    char rates[256], range[32];
    disk_rates_text(q, rates, sizeof rates);
    double all = p->disk_bytes + p->disk_saved_bytes;
    snprintf(range, sizeof range, p->n_disk > 1 ? "%d-%d" : "%d", nl - p->n_disk, nl - 1);
    char weights[64] = "";
    if (p->n_disk_w > 1)
        snprintf(weights, sizeof weights, " and the fp32 weights of %d-%d", nl - p->n_disk_w,
                 nl - 1);
    else if (p->n_disk_w)
        snprintf(weights, sizeof weights, " and the fp32 weights of %d", nl - 1);
    if (p->n_disk)
        fprintf(f, "disk: %sthe Adam m and v of layers %s%s, %.2f GB (of %.2f GB on disk, %.2f GB "
                "budget), read and written each step (%s)\n",
                q->ranks > 1 ? "this rank's parts of " : "", range, weights, p->disk_bytes / 1e9,
                all / 1e9, q->disk_budget / 1e9, rates);
    if (p->n_disk_w) print_disk_weights(p, q, f);
    if (!p->n_disk_saved) return;
    int a = 1;
    while (!p->homes[a].saved_disk) a++;
    double one = mt_plan_saved_block_bytes(q);
    fprintf(f, "disk: the saved inputs of %d layers from layer %d, %.2f GB (%.2f GB each; of "
            "%.2f GB on disk, %.2f GB budget), written in the forward and read back in the "
            "backward (%.3f s of the disk busy; %.2f GB of pinned staging; %s)\n",
            p->n_disk_saved, a, p->disk_saved_bytes / 1e9, one / 1e9, all / 1e9,
            q->disk_budget / 1e9, p->pred.disk_saved_busy,
            mt_saved_disk_staging_bytes(p->n_disk_saved, (size_t)one) / 1e9, rates);
}

/* Seconds the disk's waits add to the step of p (against the same homes
 * with every m and v and saved input in RAM). */
static double disk_extra(const mt_plan_request *q, const mt_plan *p) {
    mt_plan ram = *p;
    ram.n_disk = ram.n_disk_w = 0;
    ram.homes = mt_calloc_or_die((size_t)p->n_layers, sizeof *ram.homes);
    for (int l = 0; l < p->n_layers; l++) {
        ram.homes[l] = p->homes[l];
        if (ram.homes[l].saved_disk) ram.homes[l].saved_disk = 0, ram.homes[l].saved_host = 1;
    }
    double extra = p->pred.step - mt_plan_predict(q, &ram).step;
    free(ram.homes);
    return extra;
}

/* Whether the disk bounds the step, and how many tokens would hide it: the
 * fewest micro-batches whose plan fits and whose disk adds at most 2% (the
 * forward, which the disk layers' updates must keep ahead of, grows with
 * the tokens; the disk's traffic does not). */
static void print_disk_bound(const mt_plan *p, const mt_plan_request *q, FILE *f) {
    double extra = disk_extra(q, p);
    if (extra <= 0.02 * p->pred.step) {
        fprintf(f, "the disk's traffic hides under the step (%.3f s of it busy)\n",
                p->pred.disk_busy);
        return;
    }
    fprintf(f, "the disk bounds the step: it adds %.3f s (%.1f GB read and written); ", extra,
            (p->disk_bytes + p->disk_saved_bytes) * 2 / 1e9);
    mt_plan_request more = *q;
    for (more.M = q->M + 1; more.M <= 64 * q->M; more.M++) {
        mt_plan test;
        mt_plan_place(&more, &test); /* q was checked; no refusal's suggestion wanted */
        int fits = test.fits;
        int hidden = fits && disk_extra(&more, &test) <= 0.02 * test.pred.step;
        mt_plan_free(&test);
        if (!fits) break;
        if (!hidden) continue;
        fprintf(f, "about %.0f tokens per step (--micro-batches %d) would hide it\n",
                (double)more.M * q->B * q->T, more.M * (q->ranks > 1 ? q->ranks : 1));
        return;
    }
    fprintf(f, "no number of tokens that fits the budgets hides it (their saved layer inputs "
            "grow with them): a faster disk (more drives, --nvme-dir DIR,DIR...) shortens it\n");
}

/* Runs of consecutive layers with the same homes, as "1-12". */
void mt_plan_print(const mt_plan *p, const mt_plan_request *q, FILE *f) {
    int nl = p->n_layers, head = nl - 1;
    fprintf(f, "placement (layer 0 = embedding, %d = head; saved input l = layer l's input, "
            "kept for its backward; recompute: rebuilt from saved input l-1 in the backward, tokens: from the "
            "embedding):\n", head);
    for (int a = 0; a < nl;) {
        int b = a;
        while (b + 1 < nl && layer_kind(p, b + 1) == layer_kind(p, a)) b++;
        char range[32];
        snprintf(range, sizeof range, a == b ? "%d" : "%d-%d", a, b);
        const mt_layer_home *h = &p->homes[a];
        fprintf(f, "  layers %-9s gradient %-4s  saved input %-9s  %s\n", range,
                h->grad_host ? "host" : "GPU",
                a == 0                                  ? "-"
                : h->saved_recompute && a == 1           ? "tokens"
                : h->saved_recompute && a >= nl - 2      ? "GPU"
                : h->saved_recompute                     ? "recompute"
                : h->saved_disk                          ? "disk"
                : h->saved_host                          ? "host"
                                                        : "GPU",
                layer_kind(p, a) < 0        ? ""
                : layer_kind(p, a) & 4      ? "activations kept"
                : layer_kind(p, a) & 64     ? "down output kept"
                                            : "");
        a = b + 1;
    }
    char down[96] = "";
    if (p->n_keep_down)
        snprintf(down, sizeof down, "; down projection output kept: %d more (their recompute "
                 "stops after the GeGLU)", p->n_keep_down);
    fprintf(f, "host gradients: %s; %skept layers: %d of %lld%s%s; AdamW on the GPU: ",
            p->host_grad_bf16 ? "bf16 (rounded once from the fp32 GPU sum)" : "fp32",
            q->saved_bf16 ? "host saved inputs: bf16 (rounded from the fp32 stream); " : "",
            p->n_keep, (long long)q->cfg->L,
            p->n_keep && p->lean_keep ? " (lean: the mid-block residual rebuilt)" : "", down);
    if (p->n_dev > 1) fprintf(f, "layers 0-%d\n", p->n_dev - 1);
    else fprintf(f, p->n_dev ? "layer 0\n" : "none\n");
    fprintf(f, "GPU:  %7.2f GB of %.2f GB budget (context reserve %.1f GB included)\n",
            p->gpu_bytes / 1e9, q->gpu_budget / 1e9, MT_CUDA_CONTEXT_RESERVE / 1e9);
    if (q->ranks > 1)
        fprintf(f, "rank %d of %d: its part of every layer (1/%d of the store)\n", q->rank,
                q->ranks, q->ranks);
    fprintf(f, "host: %7.2f GB of %.2f GB budget: store %.2f GB (%s), pinned %.2f GB; "
            "%.2f bytes/param\n", p->host_bytes / 1e9, q->host_budget / 1e9, p->store_bytes / 1e9,
            p->n_disk_w ? "12 B/param less the disk's m, v and fp32 weights, with their bf16 "
                          "copy and staging"
            : p->n_disk ? "12 B/param less the disk's m and v, with their staging"
                        : "12 B/param",
            p->pinned_bytes / 1e9, (p->store_bytes + p->pinned_bytes) / (double)q->t->n_params);
    if (p->n_disk || p->n_disk_saved) print_disk(p, q, f);
    const mt_step_prediction *s = &p->pred;
    double tok = (double)q->M * q->B * q->T;
    double flops = mt_config_train_flops_per_token(q->cfg, q->T) * tok;
    char coll[96] = "";
    if (q->ranks > 1)
        snprintf(coll, sizeof coll, ", collectives %.3f at %.0f GB/s", s->coll_busy,
                 q->rates.link_gbs);
    if (p->n_disk || p->n_disk_saved)
        snprintf(coll + strlen(coll), sizeof coll - strlen(coll), ", disk %.3f", s->disk_busy);
    fprintf(f, "predicted step %.3f s (forward %.3f, head+backward %.3f; compute %.3f, H2D busy "
            "%.3f, D2H busy %.3f%s, CPU AdamW %.3f overlapped) = %.0f model TFLOPS%s [rates: "
            "%s]\n", s->step, s->fwd, s->bwd, s->compute, s->h2d_busy, s->d2h_busy, coll, s->opt,
            flops / s->step / 1e12, q->ranks > 1 ? " per GPU" : "", q->rates.source);
    if (p->n_disk || p->n_disk_saved) print_disk_bound(p, q, f);
}
