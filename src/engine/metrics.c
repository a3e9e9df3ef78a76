/* metrics.jsonl writer (with truncation on resume) and the progress line. */
#include "engine/metrics.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "io/file.h"
#include "util/mem.h"

mt_metrics_row mt_metrics_row_make(int64_t step) {
    return (mt_metrics_row){.step = step, .epoch = NAN, .loss = NAN, .lr = NAN,
                            .grad_norm = NAN, .tokens = -1, .tokens_per_s = NAN, .tflops = NAN,
                            .step_time_s = NAN, .gpu_mem_gb = NAN, .host_mem_gb = NAN,
                            .h2d_gbps = NAN, .d2h_gbps = NAN, .eta_s = NAN,
                            .skipped = -1, .empty_batches = -1, .eval_loss = NAN,
                            .eval_tokens = -1, .eval_time_s = NAN,
                            .pref = {NAN, NAN, NAN, NAN, NAN, NAN},
                            .eval_pref = {NAN, NAN, NAN, NAN, NAN, NAN}, .skipped_pairs = -1};
}

/* A field of mt_metrics_row: a double, absent when not finite, or an
 * int64_t count, absent when < 0. Its value as a double, NAN when absent. */
typedef struct row_field {
    const char *name;
    size_t off;
    bool is_int;
} row_field;

static int64_t field_int(const mt_metrics_row *row, const row_field *f) {
    int64_t k;
    memcpy(&k, (const char *)row + f->off, sizeof k);
    return k;
}

static double field_value(const mt_metrics_row *row, const row_field *f) {
    if (f->is_int) return field_int(row, f) >= 0 ? (double)field_int(row, f) : NAN;
    double v;
    memcpy(&v, (const char *)row + f->off, sizeof v);
    return v;
}

#define DOUBLE_FIELD(name, field) {name, offsetof(mt_metrics_row, field), false}
#define INT_FIELD(name, field) {name, offsetof(mt_metrics_row, field), true}
/* the six preference metrics of pref or eval_pref, named prefix + TRL's name */
#define PREF_FIELDS(prefix, row)                                              \
    DOUBLE_FIELD(prefix "rewards/chosen", row.rewards_chosen),                \
    DOUBLE_FIELD(prefix "rewards/rejected", row.rewards_rejected),            \
    DOUBLE_FIELD(prefix "rewards/accuracies", row.rewards_accuracies),        \
    DOUBLE_FIELD(prefix "rewards/margins", row.rewards_margins),              \
    DOUBLE_FIELD(prefix "logps/chosen", row.logps_chosen),                    \
    DOUBLE_FIELD(prefix "logps/rejected", row.logps_rejected)

/* JSON ------------------------------------------------------------------- */

/* The fields of a JSON line after "step", in order (a skipped step's
 * fields come last). */
static const row_field json_fields[] = {
    DOUBLE_FIELD("epoch", epoch),           DOUBLE_FIELD("loss", loss),
    DOUBLE_FIELD("lr", lr),                 DOUBLE_FIELD("grad_norm", grad_norm),
    INT_FIELD("tokens", tokens),            DOUBLE_FIELD("tokens_per_s", tokens_per_s),
    DOUBLE_FIELD("tflops", tflops),         DOUBLE_FIELD("step_time_s", step_time_s),
    DOUBLE_FIELD("gpu_mem_gb", gpu_mem_gb), DOUBLE_FIELD("host_mem_gb", host_mem_gb),
    DOUBLE_FIELD("h2d_gbps", h2d_gbps),     DOUBLE_FIELD("d2h_gbps", d2h_gbps),
    DOUBLE_FIELD("eta_s", eta_s),           DOUBLE_FIELD("eval_loss", eval_loss),
    INT_FIELD("eval_tokens", eval_tokens),  DOUBLE_FIELD("eval_time_s", eval_time_s),
    INT_FIELD("empty_batches", empty_batches),
    PREF_FIELDS("", pref),                  PREF_FIELDS("eval_", eval_pref),
    INT_FIELD("skipped_pairs", skipped_pairs),
};

void mt_metrics_format_json(const mt_metrics_row *r, char *buf, size_t n) {
    size_t u = (size_t)snprintf(buf, n, "{\"step\":%lld", (long long)r->step);
    for (size_t i = 0; i < sizeof json_fields / sizeof *json_fields && u < n; i++) {
        const row_field *f = &json_fields[i];
        double v = field_value(r, f);
        if (!isfinite(v)) continue;
        /* %.9g: every float32 (loss, norms) exactly; doubles to 9 digits. */
        if (f->is_int)
            u += (size_t)snprintf(buf + u, n - u, ",\"%s\":%lld", f->name,
                                  (long long)field_int(r, f));
        else
            u += (size_t)snprintf(buf + u, n - u, ",\"%s\":%.9g", f->name, v);
    }
    if (r->skipped >= 0 && u < n) {
        u += (size_t)snprintf(buf + u, n - u, ",\"skipped\":%lld,\"loss_text\":\"%g\","
                              "\"grad_norm_text\":\"%g\"", (long long)r->skipped, r->loss,
                              r->grad_norm);
        if (r->nonfinite && u < n) /* a tensor name: no quotes or backslashes */
            u += (size_t)snprintf(buf + u, n - u, ",\"nonfinite\":\"%.120s\"", r->nonfinite);
    }
    if (u < n) snprintf(buf + u, n - u, "}");
}

/* Writer ----------------------------------------------------------------- */

static char *read_all(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    char *buf = NULL;
    size_t cap = 0;
    *len = 0;
    for (;;) {
        if (*len + 65536 > cap) buf = mt_realloc_or_die(buf, cap = (*len + 65536) * 2);
        size_t got = fread(buf + *len, 1, cap - *len - 1, f);
        *len += got;
        if (got == 0) break;
    }
    fclose(f);
    buf[*len] = 0;
    return buf;
}

/* Keeps a line unless it is torn (no newline) or logs a step > keep_step. */
static bool keep_line(const char *line, size_t len, bool terminated, int64_t keep_step) {
    if (!terminated) return false;
    cJSON *j = cJSON_ParseWithLength(line, len);
    const cJSON *s = cJSON_GetObjectItemCaseSensitive(j, "step");
    bool keep = !cJSON_IsNumber(s) || s->valuedouble <= (double)keep_step;
    cJSON_Delete(j);
    return keep;
}

static int rewrite(const char *path, const char *data, size_t len, mt_error *err) {
    char tmp[1100];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "wb");
    if (!f) return mt_errorf(err, "metrics: writing '%s': %s", tmp, strerror(errno));
    bool bad = fwrite(data, 1, len, f) != len || fflush(f) || fsync(fileno(f));
    bad |= fclose(f) != 0;
    if (bad || rename(tmp, path)) {
        unlink(tmp);
        return mt_errorf(err, "metrics: rewriting '%s': %s (disk full?)", path, strerror(errno));
    }
    return 0;
}

/* Drops the lines after keep_step, and a torn last line (*torn: its
 * length), from an existing file. */
static int truncate_after(const char *path, int64_t keep_step, size_t *torn, mt_error *err) {
    size_t len;
    char *buf = read_all(path, &len);
    if (!buf) return 0; // no file yet
    char *out = mt_malloc_or_die(len + 1);
    size_t kept = 0;
    bool dropped = false;
    for (size_t pos = 0; pos < len;) {
        char *nl = memchr(buf + pos, '\n', len - pos);
        size_t end = nl ? (size_t)(nl - buf) + 1 : len;
        if (keep_line(buf + pos, end - pos, nl != NULL, keep_step)) {
            memcpy(out + kept, buf + pos, end - pos);
            kept += end - pos;
        } else {
            dropped = true;
        }
        if (!nl) *torn = end - pos;
        pos = end;
    }
    int rc = dropped ? rewrite(path, out, kept, err) : 0;
    free(out);
    free(buf);
    return rc;
}

int mt_metrics_open(mt_metrics_writer *w, const char *path, int64_t keep_step, mt_error *err) {
    memset(w, 0, sizeof *w);
    w->fd = -1;
    if (strlen(path) >= sizeof w->path)
        return mt_errorf(err, "metrics: path too long: %s", path);
    snprintf(w->path, sizeof w->path, "%s", path);
    if (truncate_after(path, keep_step, &w->torn, err)) return -1;
    w->fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (w->fd < 0)
        return mt_errorf(err, "metrics: opening '%s': %s (is the out directory writable?)", path,
                         strerror(errno));
    return 0;
}

int mt_metrics_open_tensorboard(mt_metrics_writer *w, const char *dir, int64_t keep_step,
                                mt_error *err) {
    w->tb = mt_tb_open(dir, keep_step + 1, err);
    return w->tb ? 0 : -1;
}

int mt_metrics_write(mt_metrics_writer *w, const mt_metrics_row *row, mt_error *err) {
    char line[2048];
    mt_metrics_format_json(row, line, sizeof line - 1);
    size_t n = strlen(line);
    line[n++] = '\n';
    struct stat st;
    if (fstat(w->fd, &st) != 0)
        return mt_errorf(err, "metrics: '%s': %s", w->path, strerror(errno));
    if (mt_write_all(w->fd, line, n, w->path, err)) {
        /* a short write left part of the row: cut it off, the file ends whole */
        if (ftruncate(w->fd, st.st_size) != 0)
            mt_error_prefix(err, "(and cutting its partial row off failed: %s) ",
                            strerror(errno));
        return mt_error_prefix(err, "metrics: step %lld: ", (long long)row->step);
    }
    if (!w->tb) return 0;
    mt_tb_scalar s[MT_METRICS_MAX_SCALARS];
    return mt_tb_write_scalars(w->tb, row->step, s, mt_metrics_scalars(row, s), err);
}

int mt_metrics_finish(mt_metrics_writer *w, mt_error *err) {
    int rc = 0;
    if (w->fd >= 0 && (fsync(w->fd) != 0 || close(w->fd) != 0))
        rc = mt_errorf(err, "metrics: '%s': %s (disk full?)", w->path, strerror(errno));
    w->fd = -1;
    if (w->tb && mt_tb_finish(w->tb, rc ? NULL : err) && rc == 0) rc = -1;
    w->tb = NULL;
    return rc;
}

void mt_metrics_close(mt_metrics_writer *w) {
    if (w->fd >= 0) close(w->fd);
    w->fd = -1;
    mt_tb_close(w->tb);
    w->tb = NULL;
}

/* TensorBoard scalars ------------------------------------------------------ */

/* The TensorBoard tag of each metrics.jsonl field that is a scalar series. */
static const row_field scalar_tags[] = {
    DOUBLE_FIELD("train/loss", loss),
    DOUBLE_FIELD("train/lr", lr),
    DOUBLE_FIELD("train/grad_norm", grad_norm),
    DOUBLE_FIELD("train/epoch", epoch),
    INT_FIELD("train/tokens", tokens),
    DOUBLE_FIELD("perf/tokens_per_s", tokens_per_s),
    DOUBLE_FIELD("perf/tflops", tflops),
    DOUBLE_FIELD("perf/step_time_s", step_time_s),
    DOUBLE_FIELD("perf/h2d_gbps", h2d_gbps),
    DOUBLE_FIELD("perf/d2h_gbps", d2h_gbps),
    DOUBLE_FIELD("memory/gpu_gb", gpu_mem_gb),
    DOUBLE_FIELD("memory/host_gb", host_mem_gb),
    DOUBLE_FIELD("eval/loss", eval_loss),
    INT_FIELD("eval/tokens", eval_tokens),
    PREF_FIELDS("train/", pref),
    PREF_FIELDS("eval/", eval_pref),
};
_Static_assert(sizeof scalar_tags / sizeof *scalar_tags <= MT_METRICS_MAX_SCALARS,
               "raise MT_METRICS_MAX_SCALARS");

size_t mt_metrics_scalars(const mt_metrics_row *row, mt_tb_scalar *out) {
    size_t n = 0;
    for (size_t i = 0; i < sizeof scalar_tags / sizeof *scalar_tags; i++) {
        double v = field_value(row, &scalar_tags[i]);
        if (isfinite(v)) out[n++] = (mt_tb_scalar){scalar_tags[i].name, (float)v};
    }
    return n;
}

/* Progress line ----------------------------------------------------------- */

void mt_format_duration(double s, char *buf, size_t n) {
    if (!isfinite(s) || s < 0) {
        snprintf(buf, n, "?");
        return;
    }
    long long t = llround(s);
    if (t < 60) snprintf(buf, n, "%llds", t);
    else if (t < 3600) snprintf(buf, n, "%lldm%02llds", t / 60, t % 60);
    else if (t < 86400) snprintf(buf, n, "%lldh%02lldm", t / 3600, t % 3600 / 60);
    else snprintf(buf, n, "%lldd%02lldh", t / 86400, t % 86400 / 3600);
}

/* Three significant digits, enough to read a rate at a glance. */
static void format_3sig(double v, char *buf, size_t n) {
    snprintf(buf, n, v < 10 ? "%.2f" : v < 100 ? "%.1f" : "%.0f", v);
}

static void format_rate(double v, char *buf, size_t n) {
    char num[32];
    const char *unit = v >= 1e6 ? "M" : v >= 1e3 ? "k" : "";
    format_3sig(v >= 1e6 ? v / 1e6 : v >= 1e3 ? v / 1e3 : v, num, sizeof num);
    snprintf(buf, n, "%s%s", num, unit);
}

typedef struct line_buf {
    char *buf;
    size_t n, used;
} line_buf;

static void add(line_buf *l, const char *fmt, const char *a) {
    if (l->used >= l->n) return;
    l->used += (size_t)snprintf(l->buf + l->used, l->n - l->used, " | ");
    if (l->used >= l->n) return;
    l->used += (size_t)snprintf(l->buf + l->used, l->n - l->used, fmt, a);
}

void mt_progress_format(const mt_metrics_row *r, int64_t total_steps, char *buf, size_t n) {
    line_buf l = {buf, n, 0};
    char t[48];
    if (total_steps > 0)
        l.used = (size_t)snprintf(buf, n, "step %lld/%lld", (long long)r->step,
                                  (long long)total_steps);
    else
        l.used = (size_t)snprintf(buf, n, "step %lld", (long long)r->step);
#define FIELD(cond, fmt, ...)                        \
    if (cond) {                                      \
        snprintf(t, sizeof t, __VA_ARGS__);          \
        add(&l, fmt, t);                             \
    }
    FIELD(!isnan(r->loss), "loss %s", "%.4f", r->loss);
    FIELD(!isnan(r->lr), "lr %s", "%.2g", r->lr);
    FIELD(!isnan(r->grad_norm), "grad norm %s", "%.3f", r->grad_norm);
    FIELD(!isnan(r->eval_loss), "eval loss %s", "%.4f", r->eval_loss);
    FIELD(!isnan(r->eval_loss), "eval ppl %s", "%.4g", exp(r->eval_loss));
    FIELD(!isnan(r->pref.rewards_accuracies), "acc %s", "%.2f", r->pref.rewards_accuracies);
    FIELD(!isnan(r->pref.rewards_margins), "margin %s", "%.3f", r->pref.rewards_margins);
    FIELD(!isnan(r->eval_pref.rewards_accuracies), "eval acc %s", "%.2f",
          r->eval_pref.rewards_accuracies);
#undef FIELD
    if (!isnan(r->tokens_per_s)) format_rate(r->tokens_per_s, t, sizeof t), add(&l, "%s tok/s", t);
    if (!isnan(r->tflops)) format_3sig(r->tflops, t, sizeof t), add(&l, "%s TFLOPS", t);
    if (!isnan(r->gpu_mem_gb)) format_3sig(r->gpu_mem_gb, t, sizeof t), add(&l, "gpu %s GB", t);
    if (!isnan(r->host_mem_gb)) format_3sig(r->host_mem_gb, t, sizeof t), add(&l, "host %s GB", t);
    if (!isnan(r->h2d_gbps)) snprintf(t, sizeof t, "%.1f", r->h2d_gbps), add(&l, "H2D %s GB/s", t);
    if (!isnan(r->d2h_gbps)) snprintf(t, sizeof t, "%.1f", r->d2h_gbps), add(&l, "D2H %s GB/s", t);
    if (!isnan(r->eta_s)) mt_format_duration(r->eta_s, t, sizeof t), add(&l, "ETA %s", t);
}
