/* Checks of a family's CPU reference against a transformers fixture (see
 * hf_check.h). */
#include "hf_check.h"

#include <cjson/cJSON.h>
#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/backend_cpu.h"
#include "engine/optimizer.h"
#include "engine/step.h"
#include "fixture.h"
#include "io/model_io.h"
#include "io/safetensors.h"
#include "megatrain.h"
#include "testlib.h"

void mt_hf_check_forward_backward(const char *model, const mt_hf_tols *tol) {
    mt_fixture f;
    mt_fixture_open(&f, model);
    mt_error err;
    size_t N = (size_t)(f.B * f.T);
    int32_t *tok = mt_fixture_i32(&f, "input_ids", 0, N);
    int32_t *tgt = mt_fixture_i32(&f, "targets", 0, N);
    /* One micro-batch of B rows, and B micro-batches of one row. */
    for (int split = 0; split < 2; split++) {
        int M = split ? (int)f.B : 1;
        int64_t B = split ? 1 : f.B;
        mt_backend *be = mt_cpu_backend_create(&f.cfg, &f.table, &f.store, M, B, f.T, &err);
        cr_assert_not_null(be, "%s", err.msg);
        mt_batch b = {.M = M, .B = B, .T = f.T, .tokens = tok, .targets = tgt};
        double loss;
        cr_assert_eq(mt_step_forward_backward(be, f.table.n_layers, &b, &loss, &err), 0, "%s",
                     err.msg);
        float *ref_loss = mt_fixture_f32(&f, "loss", NULL);
        double el = fabs(loss - ref_loss[0]) / fabs(ref_loss[0]);
        cr_assert_lt(el, tol->loss, "%s (M=%d): loss %.8f vs HF %.8f", model, M, loss,
                     ref_loss[0]);
        free(ref_loss);
        double eg = mt_fixture_compare(&f, f.store.g, "grad.", tol->grad, "gradient", 0);
        cr_log_info("%s M=%d: loss rel err %.3g, worst gradient rel err %.3g", model, M,
                    el, eg);
        if (!split) {
            double sum;
            int64_t nv;
            cr_assert_eq(mt_step_eval(be, f.table.n_layers, &b, &sum, &nv, &err), 0);
            size_t nl;
            float *ref = mt_fixture_f32(&f, "logits", &nl);
            cr_assert_eq(nl, N * (size_t)f.cfg.V);
            float *ours = malloc(nl * sizeof *ours);
            for (size_t r = 0; r < N; r++)
                mt_cpu_backend_logits(be, 0, (int64_t)r, ours + r * f.cfg.V);
            double e = mt_test_rel_err(ours, ref, nl);
            cr_log_info("%s: logits rel err %.3g", model, e);
            cr_assert_lt(e, tol->logits, "%s: logits rel err %.3g", model, e);
            free(ours);
            free(ref);
        }
        mt_cpu_backend_free(be);
    }
    free(tok);
    free(tgt);
    mt_fixture_close(&f);
}

void mt_hf_fixture_config(const char *model, struct mt_config *c) {
    char dir[600];
    mt_error err;
    snprintf(dir, sizeof dir, "%s/models/%s", mt_test_fixtures_dir(), model);
    cr_assert_eq(mt_model_load_config(c, dir, &err), 0, "%s", err.msg);
}

int64_t mt_hf_fixture_optimizer(mt_fixture *f, mt_optimizer *opt) {
    mt_error err;
    cJSON *hp = mt_fixture_train_json(f);
    cJSON *betas = cJSON_GetObjectItemCaseSensitive(hp, "betas");
    cr_assert_float_eq(mt_fixture_json_num(hp, "weight_decay_1d"), 0.0, 0,
                       "1-D tensors (norms, biases) are not decayed");
    *opt = (mt_optimizer){
        .beta1 = cJSON_GetArrayItem(betas, 0)->valuedouble,
        .beta2 = cJSON_GetArrayItem(betas, 1)->valuedouble,
        .eps = mt_fixture_json_num(hp, "eps"),
        .weight_decay = mt_fixture_json_num(hp, "weight_decay"),
        .max_grad_norm = (float)mt_fixture_json_num(hp, "max_grad_norm"),
    };
    mt_lr_kind kind;
    cJSON *sched = cJSON_GetObjectItemCaseSensitive(hp, "schedule");
    cr_assert_eq(mt_lr_kind_parse(sched->valuestring, &kind, &err), 0, "%s", err.msg);
    int64_t S = (int64_t)mt_fixture_json_num(hp, "total_steps");
    opt->sched = mt_lr_schedule_make(kind, mt_fixture_json_num(hp, "lr"),
                                     (int64_t)mt_fixture_json_num(hp, "warmup_steps"), S);
    cr_assert_eq(mt_optim_cpu_init(&opt->cpu, 0, &err), 0, "%s", err.msg);
    cJSON_Delete(hp);
    return S;
}

void mt_hf_check_trajectory(const char *model, const mt_hf_tols *tol) {
    mt_fixture f;
    mt_fixture_open(&f, model);
    mt_error err;
    mt_optimizer opt;
    int64_t S = mt_hf_fixture_optimizer(&f, &opt);

    size_t N = (size_t)(f.B * f.T);
    mt_backend *be = mt_cpu_backend_create(&f.cfg, &f.table, &f.store, 1, f.B, f.T, &err);
    cr_assert_not_null(be, "%s", err.msg);
    float *losses = mt_fixture_f32(&f, "train.losses", NULL);
    float *norms = mt_fixture_f32(&f, "train.grad_norms", NULL);
    float *lrs = mt_fixture_f32(&f, "train.lrs", NULL);
    double worst_loss = 0;
    int clipped = 0;
    for (int64_t s = 0; s < S; s++) {
        int32_t *tok = mt_fixture_i32(&f, "train.input_ids", (size_t)s * N, N);
        int32_t *tgt = mt_fixture_i32(&f, "train.targets", (size_t)s * N, N);
        mt_batch b = {.M = 1, .B = f.B, .T = f.T, .tokens = tok, .targets = tgt};
        double loss;
        cr_assert_eq(mt_step_forward_backward(be, f.table.n_layers, &b, &loss, &err), 0);
        mt_optim_report rep;
        mt_optimizer_step(&opt, &f.store, &rep);
        double el = fabs(loss - losses[s]) / fabs(losses[s]);
        if (el > worst_loss) worst_loss = el;
        cr_assert_lt(el, tol->traj, "%s step %lld: loss %.7f vs HF %.7f", model,
                     (long long)s, loss, losses[s]);
        cr_assert_lt(fabs(rep.grad_norm - norms[s]) / norms[s], tol->grad,
                     "step %lld: grad norm %.6f vs HF %.6f", (long long)s, rep.grad_norm, norms[s]);
        /* lr: both sides compute the same double formula, rounded to fp32 in
         * the fixture */
        cr_assert_lt(fabs(rep.lr - lrs[s]), 1e-9 + 1e-6 * lrs[s], "step %lld lr", (long long)s);
        clipped += rep.clip_coef < 1.0f;
        free(tok);
        free(tgt);
    }
    cr_assert_gt(clipped, 0, "%s: the fixture must exercise clipping", model);
    double ew = mt_fixture_compare(&f, f.store.w, "final.", tol->traj, "weight after 5 steps", 1);
    double em = mt_fixture_compare(&f, f.store.m, "final_exp_avg.", tol->traj,
                                   "Adam m after 5 steps", 0);
    double ev = mt_fixture_compare(&f, f.store.v, "final_exp_avg_sq.", tol->traj,
                                   "Adam v after 5 steps", 0);
    cr_log_info("%s: 5 steps: loss %.3g, weights %.3g, m %.3g, v %.3g (worst rel err)",
                model, worst_loss, ew, em, ev);
    free(losses);
    free(norms);
    free(lrs);
    mt_cpu_backend_free(be);
    mt_fixture_close(&f);
}

/* Logits of the fixture's first batch with the model in store s. */
static float *logits_of(mt_fixture *f, mt_host_store *s, const mt_config *cfg,
                        const mt_param_table *t) {
    mt_error err;
    size_t N = (size_t)(f->B * f->T);
    int32_t *tok = mt_fixture_i32(f, "input_ids", 0, N);
    int32_t *tgt = mt_fixture_i32(f, "targets", 0, N);
    mt_backend *be = mt_cpu_backend_create(cfg, t, s, 1, f->B, f->T, &err);
    cr_assert_not_null(be, "%s", err.msg);
    mt_batch b = {.M = 1, .B = f->B, .T = f->T, .tokens = tok, .targets = tgt};
    double sum;
    int64_t nv;
    cr_assert_eq(mt_step_eval(be, t->n_layers, &b, &sum, &nv, &err), 0, "%s", err.msg);
    float *out = malloc(N * (size_t)cfg->V * sizeof *out);
    for (size_t r = 0; r < N; r++) mt_cpu_backend_logits(be, 0, (int64_t)r, out + r * cfg->V);
    mt_cpu_backend_free(be);
    free(tok);
    free(tgt);
    return out;
}

void mt_hf_check_save_reload(const char *model) {
    mt_fixture f;
    mt_fixture_open(&f, model);
    mt_error err;
    char *dir = mt_test_tmpdir();
    char out[600];
    snprintf(out, sizeof out, "%s/saved", dir);
    cr_assert_eq(mt_model_save(&f.store, &f.cfg, out, MT_DTYPE_F32, (size_t)1 << 30, &err), 0,
                 "%s", err.msg);

    mt_st_model hf, ours;
    cr_assert_eq(mt_st_model_open(&hf, f.dir, &err), 0, "%s", err.msg);
    cr_assert_eq(mt_st_model_open(&ours, out, &err), 0, "%s", err.msg);
    cr_assert_eq(ours.n_tensors, hf.n_tensors);
    for (int i = 0; i < hf.n_tensors; i++) {
        const mt_st_tensor_info *a = hf.tensors[i];
        const mt_st_tensor_info *b = mt_st_model_find(&ours, a->name);
        cr_assert_not_null(b, "saved model lacks %s", a->name);
        cr_assert_eq(b->ndim, a->ndim, "%s", a->name);
        for (int d = 0; d < a->ndim; d++) cr_assert_eq(b->shape[d], a->shape[d], "%s", a->name);
    }
    mt_st_model_close(&hf);
    mt_st_model_close(&ours);

    mt_config cfg;
    mt_param_table t;
    mt_host_store s;
    cr_assert_eq(mt_model_load_config(&cfg, out, &err), 0, "%s", err.msg);
    /* every field of the config that was read comes back (the names of
     * model_type and such included) */
    cr_assert_eq(memcmp(&cfg, &f.cfg, sizeof cfg), 0, "%s: the config changed through save",
                 model);
    cr_assert_eq(mt_params_init(&t, &cfg, &err), 0, "%s", err.msg);
    cr_assert_eq(mt_host_store_init(&s, &t, &err), 0, "%s", err.msg);
    cr_assert_eq(mt_model_load_weights(&s, out, &err), 0, "%s", err.msg);
    size_t n = (size_t)(f.B * f.T * f.cfg.V);
    float *a = logits_of(&f, &f.store, &f.cfg, &f.table);
    float *b = logits_of(&f, &s, &cfg, &t);
    cr_assert_eq(memcmp(a, b, n * sizeof *a), 0, "fp32 save and reload must be exact");
    free(a);
    free(b);
    mt_host_store_free(&s);
    mt_params_free(&t);
    mt_fixture_close(&f);
    mt_test_rmtree(dir);
    free(dir);
}


void mt_hf_check_trains_on_cpu(const char *model, const char *dir, const char *label,
                               mt_config *saved) {
    char data[512], out[512];
    snprintf(data, sizeof data, "%s/data.jsonl", dir);
    snprintf(out, sizeof out, "%s/run", dir);
    FILE *f = fopen(data, "w");
    cr_assert(f, "%s", data);
    for (int i = 0; i < 200; i++)
        fprintf(f, "{\"text\": \"the old man saw the river boat near the city by night %d\"}\n",
                i % 7);
    fclose(f);
    mt_options *o = mt_options_new();
    const char *kv[][2] = {{"model", model},       {"data", data},         {"out", out},
                           {"device", "cpu"},      {"steps", "16"},        {"seq_len", "32"},
                           {"batch_size", "4"},    {"micro_batches", "2"}, {"lr", "3e-3"},
                           {"warmup_steps", "2"},  {"save_every", "0"},    {"sample_tokens", "0"},
                           {"save_dtype", "fp32"}};
    for (size_t i = 0; i < sizeof kv / sizeof *kv; i++)
        cr_assert_eq(mt_options_set(o, kv[i][0], kv[i][1]), 0, "%s", mt_last_error());
    mt_run *r = mt_run_open(o, NULL, NULL);
    cr_assert(r, "%s", mt_last_error());
    mt_step_metrics m[16];
    int n = 0;
    while (n < 16 && mt_run_step(r, &m[n]) == 0) {
        cr_assert(isfinite(m[n].loss), "step %d", n);
        n++;
    }
    cr_assert_eq(n, 16);
    double first = (m[0].loss + m[1].loss) / 2, last = (m[14].loss + m[15].loss) / 2;
    /* from ~ln(V) at random init: a drop of 1 nat on this repetitive text
     * takes a few steps */
    cr_log_info("%s made by init: loss %.4f -> %.4f in 16 steps", label, first, last);
    cr_assert_lt(last, first - 1.0, "loss %.4f -> %.4f", first, last);
    cr_assert_eq(mt_run_finish(r), 0, "%s", mt_last_error());
    mt_run_close(r);
    mt_options_free(o);
    char dirname[640];
    mt_error err;
    snprintf(dirname, sizeof dirname, "%s/model", out);
    cr_assert_eq(mt_model_load_config(saved, dirname, &err), 0, "%s", err.msg);
}

void mt_hf_check_refusals(const char *base, const mt_hf_refusal *cases, size_t n) {
    for (size_t i = 0; i < n; i++) {
        char json[1024];
        snprintf(json, sizeof json, "{%s, %s}", base, cases[i].extra);
        mt_config c;
        mt_error err;
        cr_assert_eq(mt_config_parse(&c, json, "config.json", &err), -1, "%s accepted",
                     cases[i].extra);
        cr_assert(strstr(err.msg, cases[i].field), "\"%s\" does not name %s", err.msg,
                  cases[i].field);
    }
}

void mt_hf_tiny_shape(mt_model_shape *s, const char *model_type) {
    mt_model_shape_defaults(s);
    s->model_type = model_type;
    s->hidden = 64, s->layers = 2, s->heads = 4, s->kv_heads = 2, s->ffn = 128;
    s->max_positions = 64, s->init_std = 0.1;
}

void mt_hf_init_model(const char *model, const mt_model_shape *s, mt_model_info *info,
                      mt_config *c) {
    char tok[512];
    mt_error err;
    snprintf(tok, sizeof tok, "%s/tokenizer/tiny_bytelevel.json", mt_test_fixtures_dir());
    cr_assert_eq(mt_model_init(model, tok, s, info), 0, "%s", mt_last_error());
    cr_assert_str_eq(info->model_type, s->model_type);
    cr_assert_eq(mt_model_load_config(c, model, &err), 0, "%s", err.msg);
    cr_assert_eq(info->n_params, mt_config_num_params(c));
}
