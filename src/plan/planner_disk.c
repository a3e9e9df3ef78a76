/* The planner's model of the optimizer thread and of the disk tier it
 * reads and writes (the m and v of the last layers, host/disk_state.h):
 * the disk's rates, a rank's share of them and of its bytes, and the
 * transfers of a step as the tier issues them; and of the saved layer
 * inputs on disk (backend/cuda/saved_disk.h). */
#include <math.h>
#include <stdlib.h>

#include "host/disk_state.h"
#include "plan/planner_internal.h"
#include "util/mem.h"

/* The disk tier's rates, bytes a second: reads and writes as measured (an
 * assumed 2 GB/s each way where they were not: one NVMe drive of a cloud
 * GPU machine), and both at once, which bounds their sum (0: no bound). */
#define DISK_ASSUMED_GBS 2.0
void mt_plan_disk_rates(const mt_rates *r, double *rd, double *wr, double *both) {
    *rd = (r->disk_read_gbs > 0 ? r->disk_read_gbs : DISK_ASSUMED_GBS) * 1e9;
    *wr = (r->disk_write_gbs > 0 ? r->disk_write_gbs : DISK_ASSUMED_GBS) * 1e9;
    *both = r->disk_both_gbs * 1e9;
}

/* This rank's share of them: the ranks of a machine move their disk
 * layers at the same moments of their steps, over the same drives. */
static void rank_disk_rates(const mt_plan_request *q, double *rd, double *wr, double *both) {
    mt_plan_disk_rates(&q->rates, rd, wr, both);
    double n = q->disk_sharers > 1 ? q->disk_sharers : 1;
    *rd /= n, *wr /= n, *both /= n;
}

/* The disk bytes of this rank's parts of the last n layers' m and v, and
 * the RAM they free less the staging buffers (host/disk_state.h's sizes,
 * over the parts). */
void mt_plan_disk_sizes(const mt_plan_request *q, int n, int nw, double *disk, double *freed) {
    if (q->ranks <= 1) {
        mt_disk_tier_sizes(q->t, n, nw, disk, freed);
        return;
    }
    double most = 0;
    *disk = 0;
    for (int l = q->t->n_layers - n; l < q->t->n_layers; l++) {
        double b = mt_plan_part_floats(q, l) * 8.0;
        *disk += b;
        most = fmax(most, b);
    }
    *freed = *disk - MT_DISK_STAGING_BUFFERS * most;
}

int mt_plan_disk_weights_allowed(const mt_plan_request *q) {
    return q->precision == MT_GPU_BF16 && q->ranks <= 1;
}

int mt_plan_disk_weights_most(const mt_plan *p) {
    int most = p->n_layers - (p->n_dev > 1 ? p->n_dev : 1);
    return p->n_disk < most ? p->n_disk : most;
}

/* The disk tier's transfers over a step as host/disk_state.c issues them,
 * on one channel (the drives: reads and writes share them at the rate
 * measured with both at once, or each at its own where that is unknown),
 * each queued behind those issued before it. The first disk layers' reads
 * are issued as the step's updates begin, into the free staging buffers;
 * a later layer's when the optimizer asks for it or, ahead, once the
 * optimizer has the layer before it, into a buffer free by then; its
 * write when its update ends. */
typedef struct disk_sim {
    double rd, wr, both;      /* bytes/s */
    int first_w;              /* layers from this one move their weights too */
    double free_at, busy;     /* the channel free again; seconds busy */
    mt_disk_spans *spans;     /* when it is busy, or NULL */
    int layer[MT_DISK_STAGING_BUFFERS], writing[MT_DISK_STAGING_BUFFERS];
    double done[MT_DISK_STAGING_BUFFERS]; /* its read's or write's end */
} disk_sim;

static void add_span(mt_disk_spans *s, double from, double to) {
    if (s->n > 0 && s->at[2 * s->n - 1] >= from) { /* back to back: one span */
        s->at[2 * s->n - 1] = to;
        return;
    }
    if (s->n == s->cap) {
        s->cap = s->cap ? 2 * s->cap : 32;
        s->at = mt_realloc_or_die(s->at, (size_t)s->cap * 2 * sizeof *s->at);
    }
    s->at[2 * s->n] = from;
    s->at[2 * s->n + 1] = to;
    s->n++;
}

static double disk_xfer(disk_sim *d, double issue, double bytes, int write) {
    double dur = bytes / (d->both > 0 ? d->both : write ? d->wr : d->rd);
    double from = fmax(d->free_at, issue);
    d->free_at = from + dur;
    d->busy += dur;
    if (d->spans) add_span(d->spans, from, d->free_at);
    return d->free_at;
}

/* A buffer to read into at time t: a free one, or one whose write is done
 * by then (wait: else the one whose write ends first, t moved to it); -1. */
static int disk_buffer(disk_sim *d, double *t, int wait) {
    int best = -1;
    for (int b = 0; b < MT_DISK_STAGING_BUFFERS; b++) {
        if (d->layer[b] < 0 || (d->writing[b] && d->done[b] <= *t)) return b;
        if (d->writing[b] && (best < 0 || d->done[b] < d->done[best])) best = b;
    }
    if (!wait || best < 0) return -1;
    *t = fmax(*t, d->done[best]);
    return best;
}

/* Bytes of layer l's block: [m | v], 8 a parameter, or 12 with [w | m | v]. */
static double block_bytes(const disk_sim *d, const mt_plan_request *q, int l) {
    return mt_plan_part_floats(q, l) * (l >= d->first_w ? 12.0 : 8.0);
}

static void disk_read(disk_sim *d, const mt_plan_request *q, int b, int l, double t) {
    d->layer[b] = l;
    d->writing[b] = 0;
    d->done[b] = disk_xfer(d, t, block_bytes(d, q, l), 0);
}

/* The optimizer asks for disk layer l at time t: when its m and v are in
 * RAM (the reads ahead issued then); *buf their buffer. */
static double disk_get(disk_sim *d, const mt_plan_request *q, int l, double t, int *buf) {
    int b = -1, nl = q->t->n_layers;
    for (int k = 0; k < MT_DISK_STAGING_BUFFERS; k++)
        if (d->layer[k] == l && !d->writing[k]) b = k;
    if (b < 0) {
        b = disk_buffer(d, &t, 1);
        if (b < 0) b = 0; /* every buffer holds a later layer: as the tier, the first */
        disk_read(d, q, b, l, t);
    }
    double ready = fmax(t, d->done[b]);
    *buf = b;
    for (int n = l + 1; n < nl; n++) { /* read ahead into buffers free now */
        int held = 0;
        for (int k = 0; k < MT_DISK_STAGING_BUFFERS; k++)
            held |= d->layer[k] == n && !d->writing[k];
        if (held) continue;
        double at = ready;
        int f = disk_buffer(d, &at, 0);
        if (f < 0) break;
        disk_read(d, q, f, n, ready);
    }
    return ready;
}

/* The optimizer thread over a step: layer l's update starts once the one
 * before it is done and its gradient is on the host (a GPU-waiting one is
 * fetched while the layer before it is updated), and, for a disk layer,
 * once its m and v are read (disk_get), which are written back after it.
 * Fills opt_done (when each layer's weights are ready) and returns when
 * the last update ends; *disk_end when the disk's last write ends. */
double mt_plan_optimizer_times(const mt_plan_request *q, const mt_plan *plan, double start,
                               double *opt_done, double *disk_end, double *disk_busy,
                               mt_disk_spans *spans) {
    const mt_rates *r = &q->rates;
    int nl = q->t->n_layers, first_disk = nl - plan->n_disk;
    double d2h = r->d2h_gbs * 1e9, adam = r->adam_gparams * 1e9;
    disk_sim d = {.first_w = nl - plan->n_disk_w, .spans = spans};
    rank_disk_rates(q, &d.rd, &d.wr, &d.both);
    for (int b = 0; b < MT_DISK_STAGING_BUFFERS; b++)
        d.layer[b] = -1;
    for (int b = 0; b < MT_DISK_STAGING_BUFFERS && first_disk + b < nl; b++)
        disk_read(&d, q, b, first_disk + b, start);
    double opt = 0, prev_start = 0, comp = start;
    for (int l = 0; l < nl; l++) {
        double numel = mt_plan_part_floats(q, l);
        if (l < plan->n_dev) { /* p, m, v, g and the bf16 copy through HBM */
            comp += numel * 30.0 / (r->hbm_gbs * 1e9);
            opt_done[l] = comp;
            continue;
        }
        double fetched = prev_start + (plan->homes[l].grad_host ? 0 : numel * 4.0 / d2h);
        prev_start = fmax(opt, fetched);
        int buf = -1;
        if (l >= first_disk) prev_start = disk_get(&d, q, l, prev_start, &buf);
        opt = prev_start + numel / adam;
        opt_done[l] = opt;
        if (buf >= 0) { /* written back */
            d.writing[buf] = 1;
            d.done[buf] = disk_xfer(&d, opt, block_bytes(&d, q, l), 1);
        }
    }
    *disk_end = d.free_at;
    *disk_busy = d.busy;
    return opt;
}

/* ---- saved inputs on disk ---- */

double mt_plan_saved_block_bytes(const mt_plan_request *q) {
    double b = (double)q->M * q->B * q->T * q->cfg->C * (q->saved_bf16 ? 2.0 : 4.0);
    return ceil(b / MT_DISK_ALIGN) * MT_DISK_ALIGN;
}

void mt_saved_disk_sim_init(mt_saved_disk_sim *s, const mt_plan_request *q, const mt_plan *p,
                            const mt_disk_spans *adam) {
    *s = (mt_saved_disk_sim){.bytes = mt_plan_saved_block_bytes(q), .adam = adam};
    double both;
    rank_disk_rates(q, &s->rd, &s->wr, &both);
    for (int l = 1; l < p->n_layers; l++) s->n += p->homes[l].saved_disk;
    s->n_st = s->n < MT_SAVED_DISK_STAGES ? s->n : MT_SAVED_DISK_STAGES;
    s->read_end = mt_calloc_or_die((size_t)(s->n ? s->n : 1), sizeof *s->read_end);
}

void mt_saved_disk_sim_free(mt_saved_disk_sim *s) { free(s->read_end); }

/* A transfer of one block issued at `issue`: it starts when the channel is
 * free and moves in the gaps the Adam state's spans leave, which come
 * first (issued earlier, as the optimizer's reads and writes mostly are). */
static double saved_xfer(mt_saved_disk_sim *s, double issue, double rate) {
    double left = s->bytes / rate, t = fmax(s->free_at, issue);
    s->busy += left;
    const mt_disk_spans *a = s->adam;
    while (a && s->span < a->n && a->at[2 * s->span + 1] <= t) s->span++;
    for (int k = s->span; a && k < a->n && left > 0; k++) {
        double from = a->at[2 * k], to = a->at[2 * k + 1];
        if (from > t) { /* a gap before span k */
            double gap = from - t;
            if (gap >= left) break;
            left -= gap;
        }
        t = fmax(t, to);
    }
    s->free_at = t + left;
    return s->free_at;
}

double mt_saved_disk_sim_stage(mt_saved_disk_sim *s, double t) {
    return fmax(t, s->stage[s->turn]);
}

void mt_saved_disk_sim_write(mt_saved_disk_sim *s, double d2h_end) {
    s->stage[s->turn] = saved_xfer(s, d2h_end, s->wr);
    s->turn = (s->turn + 1) % s->n_st;
}

static void saved_read(mt_saved_disk_sim *s, double t) {
    if (s->next_read < s->n) s->read_end[s->next_read++] = saved_xfer(s, t, s->rd);
}

void mt_saved_disk_sim_backward(mt_saved_disk_sim *s, double t) {
    for (int k = 0; k < s->n_st; k++) saved_read(s, t);
}

double mt_saved_disk_sim_read_ready(mt_saved_disk_sim *s, double t) {
    MT_ASSERT(s->next_load < s->next_read);
    return fmax(t, s->read_end[s->next_load]);
}

void mt_saved_disk_sim_loaded(mt_saved_disk_sim *s, double h2d_end) {
    s->next_load++;
    saved_read(s, h2d_end);
}
