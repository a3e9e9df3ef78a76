/* What the planner's files share: planner.c (the step model and the
 * choice of homes), planner_disk.c (the optimizer thread and the disk
 * tier), planner_print.c (the plan's text). Internal to src/plan. */
#ifndef MT_PLAN_PLANNER_INTERNAL_H
#define MT_PLAN_PLANNER_INTERNAL_H

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

/* The disk bytes of this rank's parts of the last n layers' m and v, and
 * the RAM they free less the staging buffers. */
void mt_plan_disk_sizes(const mt_plan_request *q, int n, double *disk, double *freed);

/* The optimizer thread over a step from `start`: opt_done[l] when layer
 * l's weights are ready; returns when the last update ends, with the
 * disk's last write's end and its busy seconds. */
double mt_plan_optimizer_times(const mt_plan_request *q, const mt_plan *plan, double start,
                               double *opt_done, double *disk_end, double *disk_busy);

#endif
