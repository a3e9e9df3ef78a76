/* Loading HF reference fixtures for the CPU and GPU tests. */
#include "fixture.h"

#include <criterion/criterion.h>
#include <cjson/cJSON.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/model_io.h"
#include "testlib.h"

const char *mt_fixture_models[MT_FIXTURE_MODELS] = {
    "llama_gqa", "qwen2_bias_tied", "qwen3_qknorm_mqa", "mistral", "phi3_gqa", "phi3_longrope",
    "llama_pad", "mistral_window", "phi3_window"};

void mt_fixture_open(mt_fixture *f, const char *name) {
    mt_error err;
    memset(f, 0, sizeof *f);
    snprintf(f->dir, sizeof f->dir, "%s/models/%s", mt_test_fixtures_dir(), name);
    cr_assert_eq(mt_model_load_config(&f->cfg, f->dir, &err), 0, "%s", err.msg);
    cr_assert_eq(mt_params_init(&f->table, &f->cfg, &err), 0, "%s", err.msg);
    cr_assert_eq(mt_host_store_init(&f->store, &f->table, &err), 0, "%s", err.msg);
    cr_assert_eq(mt_model_load_weights(&f->store, f->dir, &err), 0, "%s", err.msg);
    char path[640];
    snprintf(path, sizeof path, "%s/reference.safetensors", f->dir);
    cr_assert_eq(mt_st_open(&f->ref, path, &err), 0, "%s", err.msg);
    const mt_st_tensor_info *ids = mt_st_find(&f->ref, "input_ids");
    cr_assert_not_null(ids);
    f->B = ids->shape[0];
    f->T = ids->shape[1];
}

void mt_fixture_use_ref(mt_fixture *f, const char *file) {
    mt_error err;
    char path[640];
    snprintf(path, sizeof path, "%s/%s", f->dir, file);
    mt_st_close(&f->ref);
    cr_assert_eq(mt_st_open(&f->ref, path, &err), 0, "%s", err.msg);
}

void mt_fixture_reset(mt_fixture *f) {
    mt_error err;
    cr_assert_eq(mt_model_load_weights(&f->store, f->dir, &err), 0, "%s", err.msg);
    memset(f->store.m, 0, f->table.total * sizeof(float));
    memset(f->store.v, 0, f->table.total * sizeof(float));
}

void mt_fixture_close(mt_fixture *f) {
    mt_st_close(&f->ref);
    mt_host_store_free(&f->store);
    mt_params_free(&f->table);
}

float *mt_fixture_f32(mt_fixture *f, const char *name, size_t *n) {
    const mt_st_tensor_info *t = mt_st_find(&f->ref, name);
    cr_assert_not_null(t, "reference tensor %s missing", name);
    float *x = malloc(t->numel * sizeof *x);
    mt_error err;
    cr_assert_eq(mt_st_read_f32(t, x, t->numel, &err), 0, "%s", err.msg);
    if (n) *n = t->numel;
    return x;
}

int32_t *mt_fixture_i32(mt_fixture *f, const char *name, size_t offset, size_t count) {
    const mt_st_tensor_info *t = mt_st_find(&f->ref, name);
    cr_assert_not_null(t, "reference tensor %s missing", name);
    int64_t *x = malloc(t->numel * sizeof *x);
    mt_error err;
    cr_assert_eq(mt_st_read_i64(t, x, t->numel, &err), 0, "%s", err.msg);
    cr_assert_leq(offset + count, t->numel);
    int32_t *y = malloc(count * sizeof *y);
    for (size_t i = 0; i < count; i++) y[i] = (int32_t)x[offset + i];
    free(x);
    return y;
}

/* The reference tensor prefix + the published name of td (of layer l):
 * its own, or its rows of a fused tensor (phi3's qkv_proj, gate_up_proj). */
static float *reference_of(mt_fixture *f, const char *prefix, int l, const mt_tensor_desc *td) {
    char name[96], key[160];
    int64_t rows, row0;
    bool fused = mt_params_fused(&f->table, l, td, name, &rows, &row0);
    snprintf(key, sizeof key, "%s%s", prefix, fused ? name : td->name);
    size_t n;
    float *all = mt_fixture_f32(f, key, &n);
    size_t first = fused ? (size_t)row0 * (size_t)td->shape[1] : 0;
    cr_assert_eq(n, fused ? (size_t)rows * (size_t)td->shape[1] : td->numel, "%s: size of %s",
                 f->dir, key);
    float *x = malloc(td->numel * sizeof *x);
    memcpy(x, all + first, td->numel * sizeof *x);
    free(all);
    return x;
}

double mt_fixture_compare(mt_fixture *f, const float *array, const char *prefix, double tol,
                          const char *what, int mask_noise) {
    double worst = 0;
    for (int l = 0; l < f->table.n_layers; l++) {
        const mt_layer_desc *ld = &f->table.layers[l];
        for (int k = 0; k < ld->n_tensors; k++) {
            const mt_tensor_desc *td = &ld->tensors[k];
            size_t n = td->numel;
            float *ref = reference_of(f, prefix, l, td);
            float *ours = malloc(n * sizeof *ours);
            memcpy(ours, array + ld->offset + td->offset, n * sizeof *ours);
            if (mask_noise) {
                float *v = reference_of(f, "final_exp_avg_sq.", l, td);
                for (size_t i = 0; i < n; i++)
                    if (sqrtf(v[i]) < 1e-5f) ours[i] = ref[i];
                free(v);
            }
            double e = mt_test_rel_err(ours, ref, n);
            free(ours);
            free(ref);
            cr_assert_lt(e, tol, "%s: %s of %s: rel err %.3g > %.3g", f->dir, what, td->name, e,
                         tol);
            if (e > worst) worst = e;
        }
    }
    return worst;
}

cJSON *mt_fixture_train_json(mt_fixture *f) {
    char path[640];
    snprintf(path, sizeof path, "%s/train.json", f->dir);
    FILE *fp = fopen(path, "rb");
    cr_assert_not_null(fp, "%s: missing", path);
    char buf[4096];
    size_t len = fread(buf, 1, sizeof buf - 1, fp);
    fclose(fp);
    buf[len] = 0;
    cJSON *hp = cJSON_Parse(buf);
    cr_assert_not_null(hp, "%s: not JSON", path);
    return hp;
}

double mt_fixture_json_num(cJSON *root, const char *key) {
    cJSON *it = cJSON_GetObjectItemCaseSensitive(root, key);
    cr_assert(cJSON_IsNumber(it), "train.json: %s", key);
    return it->valuedouble;
}
