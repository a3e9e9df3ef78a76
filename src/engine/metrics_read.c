/* metrics.jsonl read back into arrays (metrics_read.h). */
#include "engine/metrics_read.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>

#include "util/mem.h"

static void push_train(mt_metrics_series *s, double step, double loss, double lr) {
    if (s->n == s->cap) {
        s->cap = s->cap ? 2 * s->cap : 256;
        s->step = mt_realloc_or_die(s->step, s->cap * sizeof *s->step);
        s->loss = mt_realloc_or_die(s->loss, s->cap * sizeof *s->loss);
        s->lr = mt_realloc_or_die(s->lr, s->cap * sizeof *s->lr);
    }
    s->step[s->n] = step, s->loss[s->n] = loss, s->lr[s->n] = lr;
    s->n++;
    s->has_lr |= !isnan(lr);
}

static void push_eval(mt_metrics_series *s, double step, double loss) {
    if (s->n_eval == s->eval_cap) {
        s->eval_cap = s->eval_cap ? 2 * s->eval_cap : 64;
        s->eval_step = mt_realloc_or_die(s->eval_step, s->eval_cap * sizeof *s->eval_step);
        s->eval_loss = mt_realloc_or_die(s->eval_loss, s->eval_cap * sizeof *s->eval_loss);
    }
    s->eval_step[s->n_eval] = step, s->eval_loss[s->n_eval] = loss;
    s->n_eval++;
}

void mt_metrics_series_free(mt_metrics_series *s) {
    free(s->step);
    free(s->loss);
    free(s->lr);
    free(s->eval_step);
    free(s->eval_loss);
    memset(s, 0, sizeof *s);
}

int mt_metrics_read(const char *path, mt_metrics_series *s, const char *who, mt_error *err) {
    FILE *f = fopen(path, "rb");
    if (!f)
        return mt_errorf(err, "'%s': %s (give the metrics.jsonl of a run's out directory)", path,
                         strerror(errno));
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    for (long lineno = 1; (len = getline(&line, &cap, f)) >= 0; lineno++) {
        cJSON *j = cJSON_ParseWithLength(line, (size_t)len);
        if (!j) {
            if (who && strspn(line, " \t\r\n") != (size_t)len)
                fprintf(stderr, "%s: warning: %s:%ld is not JSON, skipped\n", who, path, lineno);
            continue;
        }
        const cJSON *st = cJSON_GetObjectItemCaseSensitive(j, "step");
        const cJSON *lo = cJSON_GetObjectItemCaseSensitive(j, "loss");
        const cJSON *lr = cJSON_GetObjectItemCaseSensitive(j, "lr");
        const cJSON *ev = cJSON_GetObjectItemCaseSensitive(j, "eval_loss");
        if (cJSON_IsNumber(st) && cJSON_IsNumber(lo))
            push_train(s, st->valuedouble, lo->valuedouble,
                       cJSON_IsNumber(lr) ? lr->valuedouble : NAN);
        if (cJSON_IsNumber(st) && cJSON_IsNumber(ev)) push_eval(s, st->valuedouble, ev->valuedouble);
        cJSON_Delete(j);
    }
    free(line);
    fclose(f);
    if (s->n == 0) {
        mt_metrics_series_free(s);
        return mt_errorf(err, "'%s' has no rows with \"step\" and \"loss\" (is it a megatrain "
                              "metrics.jsonl? a run logs every log_every steps)", path);
    }
    return 0;
}
