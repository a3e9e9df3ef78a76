/* Optimizer step: exact global clipping needs every layer's gradient norm
 * before any layer is updated, so the norm pass comes first. */
#include "engine/optimizer.h"

#include "host/disk_state.h"
#include "optim/clip.h"

double mt_optimizer_layer_sumsq(const mt_optimizer *o, const mt_host_store *s, int layer) {
    const mt_layer_desc *ld = &s->table->layers[layer];
    /* Padding between tensors is never written by backward and stays 0. */
    return mt_sumsq(&o->cpu, s->g + ld->offset, ld->numel);
}

/* torch's state["step"] after += 1; matrices decay, norms and biases not
 * (the Hugging Face Trainer's parameter groups). */
static mt_adamw_hparams hparams(const mt_optimizer *o, double lr) {
    return (mt_adamw_hparams){
        .lr = lr, .beta1 = o->beta1, .beta2 = o->beta2, .eps = o->eps, .step = o->step + 1};
}

static double decay_of(const mt_optimizer *o, const mt_tensor_desc *td) {
    return td->ndim == 2 ? o->weight_decay : 0.0;
}

void mt_optimizer_update_layer(const mt_optimizer *o, mt_host_store *s, int layer,
                               mt_grad_view g, float clip_coef, double lr) {
    const mt_layer_desc *ld = &s->table->layers[layer];
    mt_adamw_hparams h = hparams(o, lr);
    /* the layer's m and v (and its weights): in the store, or brought in
     * from the disk, which then leaves the store a bf16 copy of the new
     * weights (the AdamW's shadow) and the exact tensors the GPU reads */
    int away = mt_disk_state_on_disk(s->disk, layer);
    float *w = s->w + ld->offset, *m = s->m + ld->offset, *v = s->v + ld->offset, *dw = NULL;
    if (away) {
        mt_disk_state_get(s->disk, layer, &dw, &m, &v);
        if (!m) return; /* a disk failure, reported by mt_disk_state_error: the run stops */
    }
    uint16_t *copy = dw ? s->w16 + ld->offset : NULL;
    if (dw) w = dw;
    for (int k = 0; k < ld->n_tensors; k++) {
        const mt_tensor_desc *td = &ld->tensors[k];
        size_t off = td->offset;
        double wd = decay_of(o, td);
        uint16_t *shadow = copy ? copy + off : NULL;
        if (g.bf16)
            mt_adamw_update_g16(&o->cpu, w + off, m + off, v + off,
                                (const uint16_t *)g.p + td->offset, shadow, td->numel, &h, wd,
                                clip_coef);
        else
            mt_adamw_update(&o->cpu, w + off, m + off, v + off, (const float *)g.p + td->offset,
                            shadow, td->numel, &h, wd, clip_coef);
    }
    if (dw) mt_host_store_keep_exact(s, layer, w);
    if (away) mt_disk_state_put(s->disk, layer);
}

void mt_optimizer_layer_coefs(const mt_optimizer *o, const mt_param_table *t, int layer,
                              float clip_coef, double lr, mt_adamw_coefs *out) {
    const mt_layer_desc *ld = &t->layers[layer];
    mt_adamw_hparams h = hparams(o, lr);
    for (int k = 0; k < ld->n_tensors; k++)
        out[k] = mt_adamw_coefs_make(&h, decay_of(o, &ld->tensors[k]), clip_coef);
}

void mt_optimizer_plan(const mt_optimizer *o, double total_sumsq, mt_optim_report *rep) {
    float norm = 0;
    float coef = mt_clip_coef(total_sumsq, o->max_grad_norm > 0 ? o->max_grad_norm : 0, &norm);
    if (o->max_grad_norm <= 0) coef = 1.0f;
    *rep = (mt_optim_report){.grad_norm = norm, .clip_coef = coef,
                             .lr = mt_lr_at(&o->sched, o->step)};
}

void mt_optimizer_step(mt_optimizer *o, mt_host_store *s, mt_optim_report *rep) {
    double sumsq = 0;
    for (int l = 0; l < s->table->n_layers; l++) sumsq += mt_optimizer_layer_sumsq(o, s, l);
    mt_optimizer_apply(o, s, sumsq, rep);
}

void mt_optimizer_apply(mt_optimizer *o, mt_host_store *s, double total_sumsq,
                        mt_optim_report *rep) {
    mt_optim_report r;
    mt_optimizer_plan(o, total_sumsq, &r);
    mt_disk_state_prefetch(s->disk);
    for (int l = 0; l < s->table->n_layers; l++)
        mt_optimizer_update_layer(o, s, l, mt_grad_f32(s->g + s->table->layers[l].offset),
                                  r.clip_coef, r.lr);
    o->step++;
    if (rep) *rep = r;
}
