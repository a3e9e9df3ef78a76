/* Learning-rate schedules of Hugging Face transformers
 * (get_{cosine,linear,constant}_schedule_with_warmup) as applied by
 * torch.optim.lr_scheduler.LambdaLR: the lr of the update made after k
 * updates (k = 0 for the first) is base_lr * lambda(k), in double.
 *
 *   warmup (k < warmup):  k / max(1, warmup)
 *   cosine:   max(0, f*(1 - min_lr_ratio) + min_lr_ratio),
 *             f = 0.5*(1 + cos(pi * num_cycles * 2 * progress)),
 *             progress = (k - warmup) / max(1, total - warmup)
 *   linear:   max(0, (total - k) / max(1, total - warmup))
 *   constant: 1
 * min_lr_ratio (0 by default) is transformers' min_lr_rate of
 * get_cosine_with_min_lr_schedule_with_warmup; with 0 the formula is the
 * plain cosine one bit for bit. It only applies to cosine. */
#ifndef MT_OPTIM_SCHEDULE_H
#define MT_OPTIM_SCHEDULE_H

#include <stdint.h>

#include "util/error.h"

typedef enum mt_lr_kind { MT_LR_COSINE, MT_LR_LINEAR, MT_LR_CONSTANT } mt_lr_kind;

typedef struct mt_lr_schedule {
    mt_lr_kind kind;
    double base_lr;
    int64_t warmup_steps;
    int64_t total_steps;
    double num_cycles;   // cosine only; 0.5 = half a cosine, down to 0 at total_steps
    double min_lr_ratio; // cosine only; floor as a fraction of base_lr
} mt_lr_schedule;

/* A schedule with the defaults: num_cycles 0.5, min_lr_ratio 0. */
mt_lr_schedule mt_lr_schedule_make(mt_lr_kind kind, double base_lr, int64_t warmup_steps,
                                   int64_t total_steps);

/* "cosine" | "linear" | "constant"; -1 with a message otherwise. */
int mt_lr_kind_parse(const char *name, mt_lr_kind *out, mt_error *err);
const char *mt_lr_kind_name(mt_lr_kind kind);

/* lambda(k) and base_lr * lambda(k) for k >= 0 updates already made. */
double mt_lr_lambda(const mt_lr_schedule *s, int64_t k);
double mt_lr_at(const mt_lr_schedule *s, int64_t k);

#endif
