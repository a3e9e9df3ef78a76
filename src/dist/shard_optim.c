/* The optimizer over a rank's share of the store (see shard_optim.h): the
 * one-process optimizer over the parts' table, whose tensors are the
 * pieces (the weight decay is chosen per tensor, matrices only). */
#include "dist/shard_optim.h"

#include "optim/clip.h"

double mt_shard_optim_sumsq(const mt_optimizer *o, const mt_shard_store *s, const float *g) {
    const mt_shard_layout *sl = &s->layout;
    double total = 0;
    for (int l = 0; l < sl->table->n_layers; l++)
        total += mt_sumsq(&o->cpu, g + sl->local[l], mt_shard_len(sl, l));
    return total;
}

void mt_shard_optim_apply(mt_optimizer *o, mt_shard_store *s, const float *g, double total_sumsq,
                          mt_optim_report *rep) {
    /* the parts' table has a tensor per piece, with its tensor's ndim */
    mt_host_store h = mt_shard_store_host(s);
    h.g = (float *)g;
    mt_optimizer_apply(o, &h, total_sumsq, rep);
}
