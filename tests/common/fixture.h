/* The HF reference fixtures of scripts/make_fixtures.py, loaded for tests:
 * the model into a host store, and the reference tensors by name. */
#ifndef MT_TEST_FIXTURE_H
#define MT_TEST_FIXTURE_H

#include <stdint.h>

#include "host/store.h"
#include "io/safetensors.h"
#include "model/config.h"
#include "model/params.h"

typedef struct mt_fixture {
    char dir[512];
    mt_config cfg;
    mt_param_table table;
    mt_host_store store;
    mt_st_file ref;
    int64_t B, T;
} mt_fixture;

/* The dense fixture models every backend is checked on: llama (GQA,
 * llama3 rope), qwen2 (q/k/v bias, tied), qwen3 (q/k norm, MQA), mistral,
 * phi3 (fused qkv_proj and gate_up_proj; and longrope), llama with
 * pad_token_id set (its embedding row gets no gradient from the lookup),
 * and mistral and phi3 with sliding windows (5, 7) shorter than their
 * sequences (16). */
#define MT_FIXTURE_MODELS 9
extern const char *mt_fixture_models[MT_FIXTURE_MODELS];

/* Loads tests/fixtures/models/<name>; asserts on any failure. */
void mt_fixture_open(mt_fixture *f, const char *name);
void mt_fixture_close(mt_fixture *f);
/* Reads reference tensors from <dir>/<file> from now on (e.g.
 * "packed.safetensors", scripts/make_packed_fixture.py) instead of
 * reference.safetensors. */
void mt_fixture_use_ref(mt_fixture *f, const char *file);
/* Reloads the model weights and clears m and v (a fresh start). */
void mt_fixture_reset(mt_fixture *f);

/* Reference tensor as fp32 (malloc'd); *n its size (may be NULL). */
float *mt_fixture_f32(mt_fixture *f, const char *name, size_t *n);
/* count int32 values from an integer reference tensor, from offset. */
int32_t *mt_fixture_i32(mt_fixture *f, const char *name, size_t offset, size_t count);

/* Compares every parameter of `array` (a store array: w, g, m or v) with the
 * reference tensors prefix + HF name, by relative L2 error per tensor.
 * mask_noise: leave out elements whose reference gradient was rounding
 * noise (sqrt(final_exp_avg_sq) < 1e-5; docs/fixtures.md). Returns the
 * largest error seen and asserts it is below tol. */
double mt_fixture_compare(mt_fixture *f, const float *array, const char *prefix, double tol,
                          const char *what, int mask_noise);

/* The fixture's train.json (the trajectory's hyperparameters), parsed;
 * the caller frees it with cJSON_Delete. */
struct cJSON;
struct cJSON *mt_fixture_train_json(mt_fixture *f);
/* A number of a train.json object, asserted to be there. */
double mt_fixture_json_num(struct cJSON *root, const char *key);

#endif
