/* What the planner's files share: planner.c (the step model and the
 * choice of homes), planner_disk.c (the optimizer thread and the disk
 * tier), planner_print.c (the plan's text). Internal to src/plan. */
#ifndef MT_PLAN_PLANNER_INTERNAL_H
#define MT_PLAN_PLANNER_INTERNAL_H

#include "backend/cuda/saved_disk.h"
#include "dist/shard.h"
#include "plan/planner.h"

/* Floats of layer l this rank holds and moves over PCIe (the whole layer
 * on one GPU). */
static inline double mt_plan_part_floats(const mt_plan_request *q, int l) {
    size_t n = q->t->layers[l].numel;
    if (q->ranks <= 1) return (double)n;
    mt_shard_range r = mt_shard_split(n, q->ranks, q->rank);
    return (double)(r.end - r.begin);
}

/* The placement for q in *p, fitting or not (then with p->why), without
 * the refusal's suggestions that mt_plan_make adds (planner.c). */
void mt_plan_place(const mt_plan_request *q, mt_plan *p);

/* The disk tier's rates as measured or assumed, bytes a second: read,
 * write, and both at once (0: no bound on their sum). */
void mt_plan_disk_rates(const mt_rates *r, double *rd, double *wr, double *both);

/* The disk bytes of this rank's parts of the last n layers' m and v (and
 * the last nw layers' weights), and the RAM they free less the bf16
 * copies and the staging buffers. */
void mt_plan_disk_sizes(const mt_plan_request *q, int n, int nw, double *disk, double *freed);

/* Whether q may put layers' weights on disk (a bf16 run of one GPU), and
 * the most layers that may: not the embedding (its lookup reads fp32),
 * nor those whose AdamW runs on the GPU. */
int mt_plan_disk_weights_allowed(const mt_plan_request *q);
int mt_plan_disk_weights_most(const mt_plan *p);

/* The spans in which the disk moves the Adam state (in time order,
 * disjoint): span k is [at[2k], at[2k+1]]. */
typedef struct mt_disk_spans {
    double *at;
    int n, cap;
} mt_disk_spans;

/* The optimizer thread over a step from `start`: opt_done[l] when layer
 * l's weights are ready; returns when the last update ends, with the
 * disk's last write's end and its busy seconds; spans (NULL: not wanted)
 * receives when the disk was busy (freed by the caller). */
double mt_plan_optimizer_times(const mt_plan_request *q, const mt_plan *plan, double start,
                               double *opt_done, double *disk_end, double *disk_busy,
                               mt_disk_spans *spans);

/* The saved inputs' disk traffic over a step, as backend/cuda/saved_disk.c
 * issues it, at this rank's share of the disk's rates, in the time the
 * Adam state's transfers leave the disk free (they share the drives;
 * planner_disk.c; planner.c's replay drives it): the forward's D2H
 * of a disk layer waits for a free stage (the write of the one before it
 * in the ring), its write follows the D2H; the backward's reads, in its
 * order, start with the head's bind into the stages, each later one once
 * the H2D out of a stage has run, and each H2D waits for its read. */
typedef struct mt_saved_disk_sim {
    double rd, wr, bytes;    /* bytes/s; one layer's block */
    double free_at, busy;    /* the channel free again; seconds busy */
    double stage[MT_SAVED_DISK_STAGES]; /* when each stage is free for a D2H */
    int n_st, turn;
    int n, next_read, next_load; /* disk layers; reads issued; loads done */
    double *read_end;        /* (n) in the backward's order */
    const mt_disk_spans *adam; /* the disk's time the Adam state takes, or NULL */
    int span;                /* the first of them not yet behind free_at */
} mt_saved_disk_sim;

void mt_saved_disk_sim_init(mt_saved_disk_sim *s, const mt_plan_request *q, const mt_plan *p,
                            const mt_disk_spans *adam);
void mt_saved_disk_sim_free(mt_saved_disk_sim *s);
/* Forward: a D2H that could start at t starts at the returned time (a
 * stage free); then mt_saved_disk_sim_write with its end. */
double mt_saved_disk_sim_stage(mt_saved_disk_sim *s, double t);
void mt_saved_disk_sim_write(mt_saved_disk_sim *s, double d2h_end);
/* Backward: its first reads at t (the head's bind); the next load's H2D
 * that could start at t starts at the returned time; then
 * mt_saved_disk_sim_loaded with its end. */
void mt_saved_disk_sim_backward(mt_saved_disk_sim *s, double t);
double mt_saved_disk_sim_read_ready(mt_saved_disk_sim *s, double t);
void mt_saved_disk_sim_loaded(mt_saved_disk_sim *s, double h2d_end);

/* Bytes of one saved input on disk (every micro-batch, the host's dtype,
 * rounded up for O_DIRECT). */
double mt_plan_saved_block_bytes(const mt_plan_request *q);

#endif
