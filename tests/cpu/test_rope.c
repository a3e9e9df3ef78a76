/* Tests of the RoPE tables (src/model/rope.c) against the tables that
 * transformers' LlamaRotaryEmbedding and Phi3RotaryEmbedding (longrope)
 * produce (fixture written by
 * scripts/make_rope_fixture.py into tests/fixtures/rope/). */
#include <cjson/cJSON.h>
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/rope.h"
#include "testlib.h"

static cJSON *load_fixture(void) {
    char path[4096];
    snprintf(path, sizeof path, "%s/rope/rope_tables.json", mt_test_fixtures_dir());
    FILE *f = fopen(path, "rb");
    cr_assert(f, "cannot open %s (regenerate with scripts/make_rope_fixture.py)", path);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    rewind(f);
    char *text = malloc((size_t)n + 1);
    cr_assert(text && fread(text, 1, (size_t)n, f) == (size_t)n);
    text[n] = '\0';
    fclose(f);
    cJSON *root = cJSON_Parse(text);
    free(text);
    cr_assert(root, "%s is not valid JSON", path);
    return root;
}

static double num(const cJSON *obj, const char *key) {
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(obj, key);
    cr_assert(cJSON_IsNumber(it), "fixture field %s missing", key);
    return it->valuedouble;
}

static void config_from_case(mt_config *cfg, const cJSON *c) {
    memset(cfg, 0, sizeof *cfg);
    cfg->HD = (int64_t)num(c, "head_dim");
    cfg->rope_theta = num(c, "rope_theta");
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(c, "rope_type");
    cfg->rope_kind = MT_ROPE_DEFAULT;
    if (!strcmp(type->valuestring, "llama3")) {
        cfg->rope_kind = MT_ROPE_LLAMA3;
        cfg->rope_factor = num(c, "factor");
        cfg->rope_low_freq_factor = num(c, "low_freq_factor");
        cfg->rope_high_freq_factor = num(c, "high_freq_factor");
        cfg->rope_orig_max_pos = (int64_t)num(c, "original_max_position_embeddings");
    }
    if (!strcmp(type->valuestring, "longrope")) {
        cfg->rope_kind = MT_ROPE_LONGROPE;
        cfg->rope_orig_max_pos = (int64_t)num(c, "original_max_position_embeddings");
        cfg->max_pos = (int64_t)num(c, "max_position_embeddings");
        const char *keys[] = {"short_factor", "long_factor"};
        double *lists[] = {cfg->rope_short_factor, cfg->rope_long_factor};
        for (int k = 0; k < 2; k++) {
            const cJSON *a = cJSON_GetObjectItemCaseSensitive(c, keys[k]);
            cr_assert_eq(cJSON_GetArraySize(a), cfg->HD / 2, "%s", keys[k]);
            for (int i = 0; i < cfg->HD / 2; i++)
                lists[k][i] = cJSON_GetArrayItem(a, i)->valuedouble;
        }
        cfg->n_rope_factors = (int)(cfg->HD / 2);
    }
}

/* One unit in the last place of the larger of |a|, |b|. */
static float ulp_of(float a, float b) {
    float m = fmaxf(fabsf(a), fabsf(b));
    return nextafterf(m, INFINITY) - m;
}

Test(rope, tables_match_transformers) {
    cJSON *root = load_fixture();
    const cJSON *c;
    int ncases = 0;
    cJSON_ArrayForEach(c, cJSON_GetObjectItemCaseSensitive(root, "cases")) {
        const char *name = cJSON_GetObjectItemCaseSensitive(c, "name")->valuestring;
        mt_config cfg;
        config_from_case(&cfg, c);
        size_t T = (size_t)num(c, "T"), half = (size_t)cfg.HD / 2;
        float *inv = malloc(half * sizeof(float));
        float *cs = malloc(T * half * sizeof(float)), *sn = malloc(T * half * sizeof(float));
        mt_rope_inv_freq(inv, &cfg, T);
        mt_rope_tables(cs, sn, &cfg, T);

        // inv_freq follows PyTorch's fp32 operations one by one: exact.
        const cJSON *jinv = cJSON_GetObjectItemCaseSensitive(c, "inv_freq");
        cr_assert_eq((size_t)cJSON_GetArraySize(jinv), half);
        for (size_t i = 0; i < half; i++)
            cr_expect_eq(inv[i], (float)cJSON_GetArrayItem(jinv, (int)i)->valuedouble,
                         "%s: inv_freq[%zu] = %.9g", name, i, inv[i]);

        // The angle t * inv_freq is the same fp32 product on both sides.
        // PyTorch's vectorised cos/sin are accurate to 1 ulp, glibc's
        // cosf/sinf are correctly rounded, so the values may differ by one
        // ulp of the result (seen: ~5% of entries, never more than 1 ulp).
        // longrope multiplies both by its attention factor (sqrt(2) and
        // more here): that ulp grows with it and the product rounds once
        // more, so 2 ulps there (seen: 8 of 4608 cos and sin entries at 2).
        float ulps = cfg.rope_kind == MT_ROPE_LONGROPE ? 2.0f : 1.0f;
        const cJSON *jc = cJSON_GetObjectItemCaseSensitive(c, "cos");
        const cJSON *js = cJSON_GetObjectItemCaseSensitive(c, "sin");
        cr_assert_eq((size_t)cJSON_GetArraySize(jc), T * half);
        const cJSON *ec = jc->child, *es = js->child;
        for (size_t i = 0; i < T * half; i++, ec = ec->next, es = es->next) {
            float wc = (float)ec->valuedouble, ws = (float)es->valuedouble;
            cr_expect(fabsf(cs[i] - wc) <= ulps * ulp_of(cs[i], wc),
                      "%s: cos[%zu][%zu] %.9g vs %.9g", name, i / half, i % half, cs[i], wc);
            cr_expect(fabsf(sn[i] - ws) <= ulps * ulp_of(sn[i], ws),
                      "%s: sin[%zu][%zu] %.9g vs %.9g", name, i / half, i % half, sn[i], ws);
        }
        free(inv); free(cs); free(sn);
        ncases++;
    }
    cr_expect_eq(ncases, 8, "fixture should hold 8 cases");
    cJSON_Delete(root);
}

/* Position 0 is the identity rotation: cos 1, sin 0 for every pair. */
Test(rope, position_zero_is_identity) {
    mt_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.HD = 16;
    cfg.rope_theta = 10000.0;
    float cs[8], sn[8];
    mt_rope_tables(cs, sn, &cfg, 1);
    for (int i = 0; i < 8; i++) {
        cr_expect_eq(cs[i], 1.0f);
        cr_expect_eq(sn[i], 0.0f);
    }
}
