/* Learning-rate schedules (see schedule.h), written in the same order of
 * double operations as transformers' lambdas so the values match bit for
 * bit. */
#include "optim/schedule.h"

#include <math.h>
#include <string.h>

static const char *const kind_names[] = {"cosine", "linear", "constant"};

mt_lr_schedule mt_lr_schedule_make(mt_lr_kind kind, double base_lr, int64_t warmup_steps,
                                   int64_t total_steps) {
    return (mt_lr_schedule){.kind = kind, .base_lr = base_lr, .warmup_steps = warmup_steps,
                            .total_steps = total_steps, .num_cycles = 0.5, .min_lr_ratio = 0.0};
}

int mt_lr_kind_parse(const char *name, mt_lr_kind *out, mt_error *err) {
    for (int i = 0; i < 3; i++) {
        if (!strcmp(name, kind_names[i])) {
            *out = (mt_lr_kind)i;
            return 0;
        }
    }
    return mt_errorf(err, "unknown learning-rate schedule '%s': use cosine, linear or constant",
                     name);
}

const char *mt_lr_kind_name(mt_lr_kind kind) {
    return kind >= MT_LR_COSINE && kind <= MT_LR_CONSTANT ? kind_names[kind] : "?";
}

static int64_t max_i64(int64_t a, int64_t b) { return a > b ? a : b; }

double mt_lr_lambda(const mt_lr_schedule *s, int64_t k) {
    if (k < s->warmup_steps) return (double)k / (double)max_i64(1, s->warmup_steps);
    switch (s->kind) {
    case MT_LR_COSINE: {
        double progress = (double)(k - s->warmup_steps) /
                          (double)max_i64(1, s->total_steps - s->warmup_steps);
        double f = 0.5 * (1.0 + cos(M_PI * s->num_cycles * 2.0 * progress));
        f = f * (1 - s->min_lr_ratio) + s->min_lr_ratio;
        return f > 0 ? f : 0.0;
    }
    case MT_LR_LINEAR: {
        double f = (double)(s->total_steps - k) /
                   (double)max_i64(1, s->total_steps - s->warmup_steps);
        return f > 0 ? f : 0.0;
    }
    case MT_LR_CONSTANT: return 1.0;
    }
    return 1.0;
}

double mt_lr_at(const mt_lr_schedule *s, int64_t k) { return s->base_lr * mt_lr_lambda(s, k); }
