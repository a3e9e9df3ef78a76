/* Preference objectives: DPO (sigmoid, IPO, hinge), SimPO and ORPO, as
 * sequence objectives of the step (engine/step.h, mt_seq_objective).
 *
 * A pair is a prompt with a chosen and a rejected answer, both in the same
 * micro-batch. An answer's log-probability is the sum of its tokens'
 * (the prompt's targets are MT_IGNORE_INDEX, as in SFT). The formulas are
 * TRL's (docs/preference.md cites them): the loss is the mean over the
 * step's pairs, and for ORPO plus the mean cross-entropy of the chosen
 * answers' tokens. */
#ifndef MT_ENGINE_PREFERENCE_H
#define MT_ENGINE_PREFERENCE_H

#include <stdint.h>

#include "engine/backend.h"
#include "util/error.h"

typedef enum mt_pref_loss {
    MT_PREF_SIGMOID,  /* DPO: -logsigmoid(beta * delta), with label smoothing (cDPO) */
    MT_PREF_IPO,      /* (delta per token - 1 / (2 beta))^2 */
    MT_PREF_HINGE,    /* relu(1 - beta * delta) */
    MT_PREF_SIMPO,    /* reference-free: -logsigmoid(beta * (avg_c - avg_r) - gamma) */
    MT_PREF_ORPO,     /* reference-free: NLL(chosen) - lambda * logsigmoid(log odds ratio) */
} mt_pref_loss;

/* The name of a loss ("sigmoid", "ipo", "hinge", "simpo", "orpo"), and back
 * (-1: none). */
const char *mt_pref_loss_name(mt_pref_loss l);
int mt_pref_loss_parse(const char *name);
/* Whether the loss compares with a reference model's log-probabilities. */
int mt_pref_needs_ref(mt_pref_loss l);

typedef struct mt_pref_opts {
    mt_pref_loss loss;
    double beta;             /* DPO family, SimPO: the temperature */
    double label_smoothing;  /* sigmoid, SimPO: the probability that a label is flipped */
    double gamma;            /* SimPO: the target reward margin */
    double lambda;           /* ORPO: the weight of the odds-ratio term */
} mt_pref_opts;

/* One answer's tokens in a step's batch: flat tokens [start, end) of
 * micro-batch mb's (B*T); those with a target make its log-probability. */
typedef struct mt_pref_span {
    int mb;
    int64_t start, end;
} mt_pref_span;

typedef struct mt_pref_pair {
    mt_pref_span chosen, rejected;
    double ref_chosen, ref_rejected; /* the reference model's log-probabilities (DPO) */
} mt_pref_pair;

/* A step's (or an evaluation's) means over its pairs, under TRL's names:
 * rewards/chosen, rewards/rejected, rewards/accuracies, rewards/margins,
 * logps/chosen, logps/rejected (for SimPO and ORPO, per-token means). */
typedef struct mt_pref_metrics {
    double loss;
    double rewards_chosen, rewards_rejected, accuracies, margins;
    double logps_chosen, logps_rejected;
    int64_t pairs;
} mt_pref_metrics;

/* One step's pairs, over a batch that outlives it. */
typedef struct mt_pref_step {
    mt_pref_opts o;
    const mt_batch *batch;
    const mt_pref_pair *pairs;
    int64_t n_pairs;
    int64_t *n_tok;          /* (n_pairs, 2): tokens with a target of each answer */
    int64_t chosen_tokens;   /* all chosen answers' (ORPO's NLL) */
    /* the step's pairs and chosen tokens over all ranks, which the loss is a
     * mean over (init: n_pairs and chosen_tokens; mt_pref_step_share sets them) */
    int64_t n_all, chosen_all;
    double *logp;            /* (n_pairs, 2): each answer's log-probability, once seen */
    mt_pref_metrics sum;     /* sums over the pairs seen (means: mt_pref_step_metrics) */
} mt_pref_step;

/* Sets up a step over n pairs of batch b (n may be 0: a rank's share of a
 * step's last micro-batches); -1 with a message naming the pair when an
 * answer has no token with a target or lies outside the batch. */
int mt_pref_step_init(mt_pref_step *s, const mt_pref_opts *o, const mt_batch *b,
                      const mt_pref_pair *pairs, int64_t n, mt_error *err);
void mt_pref_step_free(mt_pref_step *s);

/* A rank of several as a pass over preference batches sees it: its
 * micro-batches of each batch, whether it writes the run's files, and
 * the sum over the ranks (added in rank order: the same bits on every
 * rank). NULL where a pass takes one: a run of one. */
typedef struct mt_pref_ranks {
    int mb_first, M;
    int lead;
    int (*sum)(void *ctx, double *x, int n, mt_error *err);
    void *ctx;
} mt_pref_ranks;

/* m's sums (s->sum) replaced by their sums over the ranks (r NULL: kept). */
int mt_pref_metrics_sum(const mt_pref_ranks *r, mt_pref_metrics *m, mt_error *err);

/* A rank's part of a step of several ranks: the pairs of micro-batches
 * [mb_first, mb_first + M) of all (n of them, over a batch of all
 * micro-batches) into mine, their micro-batch counted from mb_first, and
 * their indexes in all into ids (may be NULL); returns how many. */
int64_t mt_pref_share_pairs(const mt_pref_pair *all, int64_t n, int mb_first, int M,
                            mt_pref_pair *mine, int64_t *ids);

/* Makes s's loss the mean over n_all pairs (all ranks'), ORPO's NLL that
 * over chosen_all tokens: each rank's weights are then its part of the
 * gradient of the whole step's loss, and its sums (s->sum) its part of
 * the step's. */
void mt_pref_step_share(mt_pref_step *s, int64_t n_all, int64_t chosen_all);

/* The chosen answers' tokens with a target of n pairs of batch b. */
int64_t mt_pref_chosen_tokens(const mt_batch *b, const mt_pref_pair *pairs, int64_t n);

/* The mt_seq_objective callback (ctx: the mt_pref_step): the losses of the
 * pairs of micro-batch mb from its log-probabilities, and each token's
 * weight. */
int mt_pref_weigh(void *ctx, int mb, const float *logp, float *w, mt_error *err);

/* Evaluation: every pair's loss and metrics from logp (M, B, T) of a
 * forward pass (mt_step_logp), no weights. */
void mt_pref_step_score(mt_pref_step *s, const float *logp);

/* The means over the pairs seen so far. */
mt_pref_metrics mt_pref_step_metrics(const mt_pref_step *s);
/* The means of sums over sum.pairs pairs (s->sum, or such sums added up). */
mt_pref_metrics mt_pref_metrics_mean(mt_pref_metrics sum);

/* One answer's log-probability from logp (B*T) of its micro-batch. */
double mt_pref_span_logp(const float *logp, const int32_t *targets, mt_pref_span sp);

#endif
