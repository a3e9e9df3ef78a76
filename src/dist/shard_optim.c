/* The optimizer over a rank's share of the store (see shard_optim.h). The
 * weight decay is chosen per tensor (matrices only), so each part is
 * updated tensor piece by tensor piece. */
#include "dist/shard_optim.h"

#include <stdlib.h>

#include "optim/clip.h"
#include "util/mem.h"

double mt_shard_optim_sumsq(const mt_optimizer *o, const mt_shard_store *s, const float *g) {
    const mt_shard_layout *sl = &s->layout;
    double total = 0;
    for (int l = 0; l < sl->table->n_layers; l++)
        total += mt_sumsq(&o->cpu, g + sl->local[l], mt_shard_len(sl, l));
    return total;
}

void mt_shard_optim_apply(mt_optimizer *o, mt_shard_store *s, const float *g, double total_sumsq,
                          mt_optim_report *rep) {
    const mt_shard_layout *sl = &s->layout;
    mt_optim_report r;
    mt_optimizer_plan(o, total_sumsq, &r);
    mt_adamw_hparams h = {
        .lr = r.lr, .beta1 = o->beta1, .beta2 = o->beta2, .eps = o->eps, .step = o->step + 1};
    for (int l = 0; l < sl->table->n_layers; l++) {
        const mt_layer_desc *ld = &sl->table->layers[l];
        mt_shard_piece *pieces = mt_malloc_or_die((size_t)ld->n_tensors * sizeof *pieces);
        int n = mt_shard_pieces(sl, l, pieces);
        for (int i = 0; i < n; i++) {
            const mt_shard_piece *p = &pieces[i];
            double wd = ld->tensors[p->tensor].ndim == 2 ? o->weight_decay : 0.0;
            mt_adamw_update(&o->cpu, s->w + p->local, s->m + p->local, s->v + p->local,
                            g + p->local, NULL, p->n, &h, wd, r.clip_coef);
        }
        free(pieces);
    }
    o->step++;
    if (rep) *rep = r;
}
