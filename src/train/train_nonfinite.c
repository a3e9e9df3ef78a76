/* Finding the first non-finite gradient, and the stop-or-skip decision. */
#include "train/train_nonfinite.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

static int layer_find(mt_nonfinite *nf, const mt_param_table *t, int l, const float *g) {
    const mt_layer_desc *ld = &t->layers[l];
    for (int k = 0; k < ld->n_tensors; k++) {
        const mt_tensor_desc *td = &ld->tensors[k];
        const float *x = g + ld->offset + td->offset;
        for (size_t i = 0; i < td->numel; i++)
            if (!isfinite(x[i])) {
                nf->layer = l;
                snprintf(nf->tensor, sizeof nf->tensor, "%s", td->name);
                return 1;
            }
    }
    return 0;
}

int mt_nonfinite_find(mt_nonfinite *nf, const mt_param_table *t, const float *g) {
    nf->layer = -1;
    nf->tensor[0] = 0;
    for (int l = 0; l < t->n_layers; l++)
        if (layer_find(nf, t, l, g)) return 1;
    return 0;
}

int mt_nonfinite_find_sumsq(mt_nonfinite *nf, const mt_param_table *t, const double *sumsq,
                            const float *g) {
    nf->layer = -1;
    nf->tensor[0] = 0;
    for (int l = 0; l < t->n_layers; l++)
        if (!isfinite(sumsq[l])) {
            if (!g || !layer_find(nf, t, l, g)) nf->layer = l;
            return 1;
        }
    return 0;
}

int mt_nonfinite_decide(mt_nonfinite *nf, const mt_train_config *tc, int64_t step, double loss,
                        double grad_norm, int can_skip, mt_error *err) {
    char where[200];
    if (nf->layer < 0)
        snprintf(where, sizeof where, "the loss (every gradient is finite)");
    else if (nf->tensor[0])
        snprintf(where, sizeof where, "the gradient of %s (layer %d)", nf->tensor, nf->layer);
    else
        snprintf(where, sizeof where, "the gradient of layer %d", nf->layer);
    if (tc->on_nonfinite == MT_NONFINITE_SKIP && can_skip && nf->in_a_row < tc->max_skips) {
        nf->in_a_row++;
        nf->total++;
        snprintf(nf->warning, sizeof nf->warning, "warning: step %lld: %s is not finite (loss "
                 "%g, grad norm %g): update skipped (%lld in a row, at most %lld)",
                 (long long)step, where, loss, grad_norm, (long long)nf->in_a_row,
                 (long long)tc->max_skips);
        return 0;
    }
    if (tc->on_nonfinite == MT_NONFINITE_SKIP && can_skip)
        return mt_errorf(err, "step %lld: %s is not finite (loss %g, grad norm %g), %lld steps "
                         "in a row (--max-skips %lld): the run is diverging; lower the "
                         "learning rate or check the data (the last checkpoint is untouched)",
                         (long long)step, where, loss, grad_norm, (long long)nf->in_a_row + 1,
                         (long long)tc->max_skips);
    return mt_errorf(err, "step %lld: %s is not finite (loss %g, grad norm %g); lower the "
                     "learning rate or check the data%s (the last checkpoint is untouched)",
                     (long long)step, where, loss, grad_norm,
                     can_skip ? ", or pass --on-nonfinite skip" : "");
}

double mt_grad_norm(const mt_param_table *t, const float *g) {
    double s = 0;
    for (int l = 0; l < t->n_layers; l++) {
        const mt_layer_desc *ld = &t->layers[l];
        for (int k = 0; k < ld->n_tensors; k++) {
            const float *x = g + ld->offset + ld->tensors[k].offset;
            for (size_t i = 0; i < ld->tensors[k].numel; i++) s += (double)x[i] * x[i];
        }
    }
    return sqrt(s);
}
