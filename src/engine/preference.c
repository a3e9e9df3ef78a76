/* Preference objectives (preference.h): each pair's loss from its answers'
 * log-probabilities, and the loss's derivative with respect to each
 * answer's log-probability, which every token of the answer shares (the
 * answer's log-probability is a sum of its tokens'). Host arithmetic in
 * double; the formulas follow TRL's DPOTrainer._compute_loss,
 * CPOTrainer.cpo_loss (simpo) and ORPOTrainer.odds_ratio_loss. */
#include "engine/preference.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/ops.h" /* MT_IGNORE_INDEX */
#include "util/mem.h"

static const char *const loss_names[] = {"sigmoid", "ipo", "hinge", "simpo", "orpo"};

const char *mt_pref_loss_name(mt_pref_loss l) { return loss_names[l]; }

int mt_pref_loss_parse(const char *name) {
    for (int i = 0; i < (int)(sizeof loss_names / sizeof *loss_names); i++)
        if (!strcmp(name, loss_names[i])) return i;
    return -1;
}

int mt_pref_needs_ref(mt_pref_loss l) { return l != MT_PREF_SIMPO && l != MT_PREF_ORPO; }

/* log(sigmoid(z)) and sigmoid(z) without overflow */
static double logsig(double z) { return z >= 0 ? -log1p(exp(-z)) : z - log1p(exp(z)); }
static double sig(double z) { return z >= 0 ? 1.0 / (1.0 + exp(-z)) : exp(z) / (1.0 + exp(z)); }

/* log(1 - exp(a)), a < 0 */
static double log1mexp(double a) { return a > -M_LN2 ? log(-expm1(a)) : log1p(-exp(a)); }

/* -(1 - eps) logsigmoid(z) - eps logsigmoid(-z), and its derivative in z */
static double smoothed(double z, double eps, double *dz) {
    *dz = -(1.0 - eps) * sig(-z) + eps * sig(z);
    return -(1.0 - eps) * logsig(z) - eps * logsig(-z);
}

/* One pair's loss, its derivatives in the answers' log-probabilities c and
 * r, and what the metrics report of it. */
typedef struct pair_val {
    double loss, dc, dr;
    double rew_c, rew_r, logp_c, logp_r;
} pair_val;

/* The reference-free losses, on the answers' per-token means. */
static pair_val ref_free_loss(const mt_pref_opts *o, double c, double r, double nc, double nr) {
    pair_val v = {0};
    double ac = c / nc, ar = r / nr, dz;
    if (o->loss == MT_PREF_SIMPO) {
        v.loss = smoothed(o->beta * (ac - ar) - o->gamma, o->label_smoothing, &dz);
        v.dc = o->beta * dz / nc;
        v.dr = -o->beta * dz / nr;
        v.rew_c = o->beta * ac, v.rew_r = o->beta * ar;
    } else { /* ORPO: the odds of y are p / (1 - p), with p the per-token mean */
        double lo = (ac - ar) - (log1mexp(ac) - log1mexp(ar));
        v.loss = -o->lambda * logsig(lo);
        double dlo = -o->lambda * sig(-lo);
        v.dc = dlo / -expm1(ac) / nc;  /* d lo / d ac = 1 / (1 - exp(ac)) */
        v.dr = -dlo / -expm1(ar) / nr;
        v.rew_c = o->lambda * ac, v.rew_r = o->lambda * ar;
    }
    v.logp_c = ac, v.logp_r = ar;
    return v;
}

static pair_val pair_loss(const mt_pref_opts *o, double c, double r, double nc, double nr,
                          double ref_c, double ref_r) {
    if (!mt_pref_needs_ref(o->loss)) return ref_free_loss(o, c, r, nc, nr);
    pair_val v = {0};
    double b = o->beta, lc = c - ref_c, lr = r - ref_r, dz;
    if (o->loss == MT_PREF_SIGMOID) {
        v.loss = smoothed(b * (lc - lr), o->label_smoothing, &dz);
        v.dc = b * dz, v.dr = -b * dz;
    } else if (o->loss == MT_PREF_HINGE) {
        double m = 1.0 - b * (lc - lr);
        v.loss = m > 0 ? m : 0.0;
        v.dc = m > 0 ? -b : 0.0, v.dr = -v.dc;
    } else { /* IPO, on the log-ratios per token, as TRL */
        double d = lc / nc - lr / nr - 1.0 / (2.0 * b);
        v.loss = d * d;
        v.dc = 2.0 * d / nc, v.dr = -2.0 * d / nr;
    }
    v.rew_c = b * lc, v.rew_r = b * lr;
    v.logp_c = c, v.logp_r = r;
    return v;
}

double mt_pref_span_logp(const float *logp, const int32_t *targets, mt_pref_span sp) {
    double s = 0;
    for (int64_t t = sp.start; t < sp.end; t++)
        if (targets[t] != MT_IGNORE_INDEX) s += logp[t];
    return s;
}

static int64_t span_tokens(const int32_t *targets, mt_pref_span sp) {
    int64_t n = 0;
    for (int64_t t = sp.start; t < sp.end; t++) n += targets[t] != MT_IGNORE_INDEX;
    return n;
}

static int check_span(const mt_batch *b, mt_pref_span sp, int64_t pair, const char *which,
                      mt_error *err) {
    int64_t N = b->B * b->T;
    if (sp.mb < 0 || sp.mb >= b->M || sp.start < 0 || sp.end > N || sp.start >= sp.end)
        return mt_errorf(err, "pair %lld: its %s answer [%lld, %lld) of micro-batch %d lies "
                         "outside the batch", (long long)pair, which, (long long)sp.start,
                         (long long)sp.end, sp.mb);
    if (span_tokens(b->targets + (size_t)sp.mb * N, sp) == 0)
        return mt_errorf(err, "pair %lld: its %s answer has no token with a target (empty, "
                         "or cut off by --seq-len)", (long long)pair, which);
    return 0;
}

int mt_pref_step_init(mt_pref_step *s, const mt_pref_opts *o, const mt_batch *b,
                      const mt_pref_pair *pairs, int64_t n, mt_error *err) {
    memset(s, 0, sizeof *s);
    s->o = *o, s->batch = b, s->pairs = pairs, s->n_pairs = n;
    if (n < 0) return mt_errorf(err, "a negative number of preference pairs (%lld)", (long long)n);
    int64_t N = b->B * b->T;
    for (int64_t i = 0; i < n; i++) {
        if (check_span(b, pairs[i].chosen, i, "chosen", err) ||
            check_span(b, pairs[i].rejected, i, "rejected", err))
            return -1;
        if (pairs[i].chosen.mb != pairs[i].rejected.mb)
            return mt_errorf(err, "pair %lld: its answers are in micro-batches %d and %d; a "
                             "pair's loss needs both in one", (long long)i, pairs[i].chosen.mb,
                             pairs[i].rejected.mb);
    }
    s->n_tok = mt_malloc_or_die(((size_t)n * 2 + 1) * sizeof *s->n_tok);
    s->logp = mt_calloc_or_die((size_t)n * 2 + 1, sizeof *s->logp);
    for (int64_t i = 0; i < n; i++) {
        const int32_t *tgt = b->targets + (size_t)pairs[i].chosen.mb * N;
        s->n_tok[2 * i] = span_tokens(tgt, pairs[i].chosen);
        s->n_tok[2 * i + 1] = span_tokens(tgt, pairs[i].rejected);
        s->chosen_tokens += s->n_tok[2 * i];
    }
    s->n_all = n, s->chosen_all = s->chosen_tokens;
    return 0;
}

int64_t mt_pref_share_pairs(const mt_pref_pair *all, int64_t n, int mb_first, int M,
                            mt_pref_pair *mine, int64_t *ids) {
    int64_t k = 0;
    for (int64_t i = 0; i < n; i++) {
        if (all[i].chosen.mb < mb_first || all[i].chosen.mb >= mb_first + M) continue;
        mine[k] = all[i];
        mine[k].chosen.mb -= mb_first, mine[k].rejected.mb -= mb_first;
        if (ids) ids[k] = i;
        k++;
    }
    return k;
}

void mt_pref_step_share(mt_pref_step *s, int64_t n_all, int64_t chosen_all) {
    s->n_all = n_all, s->chosen_all = chosen_all;
}

int64_t mt_pref_chosen_tokens(const mt_batch *b, const mt_pref_pair *pairs, int64_t n) {
    int64_t N = b->B * b->T, k = 0;
    for (int64_t i = 0; i < n; i++)
        k += span_tokens(b->targets + (size_t)pairs[i].chosen.mb * N, pairs[i].chosen);
    return k;
}

void mt_pref_step_free(mt_pref_step *s) {
    free(s->n_tok);
    free(s->logp);
    memset(s, 0, sizeof *s);
}

/* Pair i's loss from logp (B*T) of its micro-batch, added to the sums. */
static pair_val score(mt_pref_step *s, int64_t i, const float *logp, const int32_t *tgt) {
    const mt_pref_pair *p = &s->pairs[i];
    double c = mt_pref_span_logp(logp, tgt, p->chosen);
    double r = mt_pref_span_logp(logp, tgt, p->rejected);
    s->logp[2 * i] = c, s->logp[2 * i + 1] = r;
    pair_val v = pair_loss(&s->o, c, r, (double)s->n_tok[2 * i], (double)s->n_tok[2 * i + 1],
                           p->ref_chosen, p->ref_rejected);
    mt_pref_metrics *m = &s->sum;
    m->loss += v.loss;
    if (s->o.loss == MT_PREF_ORPO) /* the chosen answer's NLL: its share of the mean */
        m->loss += -c / (double)s->chosen_all * (double)s->n_all;
    m->rewards_chosen += v.rew_c, m->rewards_rejected += v.rew_r;
    m->accuracies += v.rew_c > v.rew_r, m->margins += v.rew_c - v.rew_r;
    m->logps_chosen += v.logp_c, m->logps_rejected += v.logp_r;
    m->pairs++;
    return v;
}

/* w[t] += g for each token of sp with a target */
static void spread(float *w, const int32_t *tgt, mt_pref_span sp, double g) {
    for (int64_t t = sp.start; t < sp.end; t++)
        if (tgt[t] != MT_IGNORE_INDEX) w[t] += (float)g;
}

int mt_pref_weigh(void *ctx, int mb, const float *logp, float *w, mt_error *err) {
    mt_pref_step *s = ctx;
    size_t N = (size_t)(s->batch->B * s->batch->T);
    const int32_t *tgt = s->batch->targets + (size_t)mb * N;
    double np = (double)s->n_all;
    memset(w, 0, N * sizeof *w);
    for (int64_t i = 0; i < s->n_pairs; i++) {
        const mt_pref_pair *p = &s->pairs[i];
        if (p->chosen.mb != mb) continue;
        pair_val v = score(s, i, logp, tgt);
        if (!isfinite(v.loss))
            return mt_errorf(err, "pair %lld: its %s loss is not finite (log-probabilities %g "
                             "and %g)", (long long)i, mt_pref_loss_name(s->o.loss),
                             s->logp[2 * i], s->logp[2 * i + 1]);
        /* w is the derivative with respect to -logp of each token */
        spread(w, tgt, p->chosen, -v.dc / np);
        spread(w, tgt, p->rejected, -v.dr / np);
        if (s->o.loss == MT_PREF_ORPO) spread(w, tgt, p->chosen, 1.0 / (double)s->chosen_all);
    }
    return 0;
}

void mt_pref_step_score(mt_pref_step *s, const float *logp) {
    size_t N = (size_t)(s->batch->B * s->batch->T);
    for (int64_t i = 0; i < s->n_pairs; i++) {
        size_t off = (size_t)s->pairs[i].chosen.mb * N;
        score(s, i, logp + off, s->batch->targets + off);
    }
}

mt_pref_metrics mt_pref_step_metrics(const mt_pref_step *s) { return mt_pref_metrics_mean(s->sum); }

mt_pref_metrics mt_pref_metrics_mean(mt_pref_metrics m) {
    double n = m.pairs ? (double)m.pairs : 1.0;
    m.loss /= n, m.rewards_chosen /= n, m.rewards_rejected /= n, m.accuracies /= n;
    m.margins /= n, m.logps_chosen /= n, m.logps_rejected /= n;
    return m;
}

int mt_pref_metrics_sum(const mt_pref_ranks *r, mt_pref_metrics *m, mt_error *err) {
    if (!r) return 0;
    double x[8] = {m->loss, m->rewards_chosen, m->rewards_rejected, m->accuracies,
                   m->margins, m->logps_chosen, m->logps_rejected, (double)m->pairs};
    if (r->sum(r->ctx, x, 8, err)) return -1;
    *m = (mt_pref_metrics){x[0], x[1], x[2], x[3], x[4], x[5], x[6], (int64_t)x[7]};
    return 0;
}
