/* Tests of src/io/safetensors.{h,c}: a file written by the official Python
 * library, round trips of our writer, sharded models, and
 * one test per kind of malformed file. */
#include <criterion/criterion.h>
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "io/dtype.h"
#include "io/file.h"
#include "io/safetensors.h"
#include "testlib.h"

/* ---- helpers ----------------------------------------------------------- */

static char *tmp;  /* per-test temporary directory (each test is a process) */

static void setup(void) { tmp = mt_test_tmpdir(); }
static void teardown(void) {
    mt_test_rmtree(tmp);
    free(tmp);
}

static char *tmp_path(const char *name) { return mt_path_join(tmp, name); }

static void write_bytes(const char *path, const void *p, size_t n) {
    FILE *fp = fopen(path, "wb");
    cr_assert(fp, "cannot create %s", path);
    cr_assert_eq(fwrite(p, 1, n, fp), n);
    fclose(fp);
}

/* A safetensors file with the given header text (not padded) and data_len
 * bytes of data 0, 1, 2, ... */
static char *make_st(const char *header, size_t data_len) {
    size_t hlen = strlen(header);
    size_t n = 8 + hlen + data_len;
    unsigned char *buf = malloc(n);
    uint64_t h = hlen;
    memcpy(buf, &h, 8);
    memcpy(buf + 8, header, hlen);
    for (size_t i = 0; i < data_len; i++) buf[8 + hlen + i] = (unsigned char)i;
    char *path = tmp_path("x.safetensors");
    write_bytes(path, buf, n);
    free(buf);
    return path;
}

/* Opening path must fail with a message containing each of the substrings,
 * and must leave the struct empty. */
static void expect_open_error(const char *path, const char *sub1, const char *sub2) {
    mt_st_file f;
    mt_error err = {{0}};
    cr_assert_eq(mt_st_open(&f, path, &err), -1, "opened a malformed file");
    cr_assert(strstr(err.msg, sub1), "message lacks '%s': %s", sub1, err.msg);
    if (sub2) cr_assert(strstr(err.msg, sub2), "message lacks '%s': %s", sub2, err.msg);
    cr_assert(strstr(err.msg, path), "message does not name the file: %s", err.msg);
    cr_assert_null(f.map);
    cr_assert_null(f.tensors);
}

static void expect_header_error(const char *header, size_t data_len, const char *sub1,
                                const char *sub2) {
    char *path = make_st(header, data_len);
    expect_open_error(path, sub1, sub2);
    free(path);
}

static uint32_t bits_of(float f) { return mt_f32_bits(f); }

/* ---- a file written by the official Python library ---------------------- */

/* tests/fixtures/safetensors/official.{safetensors,json}, made by
 * scripts/make_safetensors_fixture.py. */
Test(safetensors, reads_file_written_by_python_safetensors) {
    char dir[1024], path[1100], jpath[1100];
    snprintf(dir, sizeof dir, "%s/safetensors", mt_test_fixtures_dir());
    snprintf(path, sizeof path, "%s/official.safetensors", dir);
    snprintf(jpath, sizeof jpath, "%s/official.json", dir);
    char *text;
    size_t len;
    mt_error err;
    cr_assert_eq(mt_read_file(jpath, &text, &len, &err), 0, "%s", err.msg);
    cJSON *exp = cJSON_Parse(text);
    free(text);
    cr_assert(exp);

    mt_st_file f;
    cr_assert_eq(mt_st_open(&f, path, &err), 0, "%s", err.msg);
    cr_assert_str_eq(mt_st_meta(&f, "format"), "pt");
    cr_assert_str_eq(mt_st_meta(&f, "producer"), "make_safetensors_fixture.py");
    cr_assert_null(mt_st_meta(&f, "absent"));

    const cJSON *tensors = cJSON_GetObjectItem(exp, "tensors");
    cr_assert_eq(f.n_tensors, cJSON_GetArraySize(tensors));
    const char *torch_names[] = {"float32", "bfloat16", "float16", "int64"};
    const mt_dtype dts[] = {MT_DTYPE_F32, MT_DTYPE_BF16, MT_DTYPE_F16, MT_DTYPE_I64};
    for (const cJSON *e = tensors->child; e; e = e->next) {
        const mt_st_tensor_info *t = mt_st_find(&f, e->string);
        cr_assert(t, "missing %s", e->string);
        const char *dtn = cJSON_GetObjectItem(e, "dtype")->valuestring;
        for (int i = 0; i < 4; i++)
            if (strcmp(dtn, torch_names[i]) == 0) cr_assert_eq(t->dtype, dts[i], "%s", t->name);
        const cJSON *shape = cJSON_GetObjectItem(e, "shape");
        cr_assert_eq(t->ndim, cJSON_GetArraySize(shape));
        for (int d = 0; d < t->ndim; d++)
            cr_assert_eq(t->shape[d], (int64_t)cJSON_GetArrayItem(shape, d)->valuedouble);

        const cJSON *vals = cJSON_GetObjectItem(e, "values");
        if (vals) {
            int64_t got[64];
            cr_assert_eq(mt_st_read_i64(t, got, t->numel, &err), 0, "%s", err.msg);
            for (size_t i = 0; i < t->numel; i++)
                cr_assert_eq(got[i], (int64_t)cJSON_GetArrayItem(vals, (int)i)->valuedouble);
            continue;
        }
        const cJSON *want = cJSON_GetObjectItem(e, "f32_bits");
        const cJSON *src = cJSON_GetObjectItem(e, "src_f32_bits");
        cr_assert_eq((size_t)cJSON_GetArraySize(want), t->numel);
        float got[64];
        cr_assert_eq(mt_st_read_f32(t, got, t->numel, &err), 0, "%s", err.msg);
        for (size_t i = 0; i < t->numel; i++) {
            uint32_t w = (uint32_t)(int32_t)cJSON_GetArrayItem(want, (int)i)->valuedouble;
            /* Widening is exact, so bits must match torch's .float(). */
            cr_assert_eq(bits_of(got[i]), w, "%s[%zu]", t->name, i);
            if (!src) continue;
            /* Our narrowing of the fp32 source must equal torch's .to(). */
            float x = mt_f32_from_bits((uint32_t)(int32_t)cJSON_GetArrayItem(src, (int)i)->valuedouble);
            float ours = t->dtype == MT_DTYPE_BF16 ? mt_bf16_to_f32(mt_f32_to_bf16(x))
                                                   : mt_f16_to_f32(mt_f32_to_f16(x));
            /* NaN payloads differ (torch's vectorised path writes 0xFFFF). */
            if (isnan(got[i])) cr_assert(isnan(ours), "%s[%zu] lost its NaN", t->name, i);
            else cr_assert_eq(bits_of(ours), w, "narrowing %s[%zu] 0x%08x", t->name, i, bits_of(x));
        }
    }
    const mt_st_tensor_info *sc = mt_st_find(&f, "model.scalar");
    cr_assert_eq(sc->ndim, 0);
    cr_assert_eq(sc->numel, 1);
    cr_assert_eq(mt_st_find(&f, "model.empty")->numel, 0);
    mt_st_close(&f);
    cJSON_Delete(exp);
}

/* ---- writer round trips ------------------------------------------------ */

typedef struct ramp { float scale; } ramp;

/* fill callback: element i of the tensor is i * scale. */
static int fill_ramp(void *ctx, const mt_st_write_tensor *t, size_t first, size_t count,
                     float *dst, mt_error *err) {
    const ramp *r = ctx;
    for (size_t i = 0; i < count; i++) dst[i] = (float)(first + i) * r->scale;
    return 0;
}

static int fill_fails(void *ctx, const mt_st_write_tensor *t, size_t first, size_t count,
                      float *dst, mt_error *err) {
    return mt_errorf(err, "source unavailable");
}

Test(safetensors, writer_round_trips_every_dtype, .init = setup, .fini = teardown) {
    enum { N = 257 };  /* odd, so later offsets are not multiples of 4 */
    float x[N];
    mt_test_fill_uniform(x, N, 7, -100.0f, 100.0f);
    x[0] = ldexpf(1.0f, -24);  /* f16 subnormal */
    x[1] = INFINITY;
    x[2] = NAN;
    int32_t i32[5] = {0, -1, 2147483647, -2147483647 - 1, 12};
    int64_t i64[3] = {1, -((int64_t)1 << 62), 99};
    uint16_t raw_bf16[3] = {0x3F80, 0xC000, 0x7FC0};
    /* More than one conversion chunk (2^20 elements) through a callback. */
    size_t big = ((size_t)1 << 20) + 3;
    ramp r = {0.5f};
    mt_st_write_tensor t[] = {
        {.name = "a.f32", .dtype = MT_DTYPE_F32, .ndim = 1, .shape = {N}, .f32 = x},
        {.name = "b.bf16", .dtype = MT_DTYPE_BF16, .ndim = 1, .shape = {N}, .f32 = x},
        {.name = "c.f16", .dtype = MT_DTYPE_F16, .ndim = 2, .shape = {1, N}, .f32 = x},
        {.name = "d.i32", .dtype = MT_DTYPE_I32, .ndim = 1, .shape = {5}, .raw = i32},
        {.name = "e.i64", .dtype = MT_DTYPE_I64, .ndim = 2, .shape = {3, 1}, .raw = i64},
        {.name = "f.raw_bf16", .dtype = MT_DTYPE_BF16, .ndim = 1, .shape = {3}, .raw = raw_bf16},
        {.name = "g.empty", .dtype = MT_DTYPE_F32, .ndim = 2, .shape = {0, 4}, .f32 = x},
        {.name = "h.scalar", .dtype = MT_DTYPE_F32, .ndim = 0, .f32 = x + 5},
        {.name = "i.big_f16", .dtype = MT_DTYPE_F16, .ndim = 1, .shape = {(int64_t)big},
         .fill = fill_ramp, .fill_ctx = &r},
    };
    int n = (int)(sizeof t / sizeof t[0]);
    mt_st_kv meta[] = {{"format", "pt"}, {"quote\"d", "back\\slash"}};
    char *path = tmp_path("rt.safetensors");
    mt_error err;
    cr_assert_eq(mt_st_write(path, t, n, meta, 2, &err), 0, "%s", err.msg);

    mt_st_file f;
    cr_assert_eq(mt_st_open(&f, path, &err), 0, "%s", err.msg);
    uint64_t hlen;
    memcpy(&hlen, f.map, 8);
    cr_assert_eq(hlen % 8, 0, "header not padded to 8 bytes");
    cr_assert_str_eq(mt_st_meta(&f, "format"), "pt");
    cr_assert_str_eq(mt_st_meta(&f, "quote\"d"), "back\\slash");
    cr_assert_eq(f.n_tensors, n);
    /* Data in the order given, contiguous. */
    size_t off = 0;
    for (int i = 0; i < n; i++) {
        cr_assert_str_eq(f.tensors[i].name, t[i].name);
        cr_assert_eq(f.tensors[i].offset, off);
        off += f.tensors[i].nbytes;
    }
    cr_assert_eq(f.size, 8 + hlen + off, "file has stray bytes");

    float got[N];
    cr_assert_eq(mt_st_read_f32(mt_st_find(&f, "a.f32"), got, N, &err), 0, "%s", err.msg);
    cr_assert_eq(memcmp(got, x, sizeof x), 0, "F32 must round-trip bit for bit");
    cr_assert_eq(mt_st_read_f32(mt_st_find(&f, "b.bf16"), got, N, &err), 0, "%s", err.msg);
    for (int i = 0; i < N; i++)
        cr_assert_eq(bits_of(got[i]), bits_of(mt_bf16_to_f32(mt_f32_to_bf16(x[i]))), "bf16 %d", i);
    const mt_st_tensor_info *c = mt_st_find(&f, "c.f16");
    cr_assert_eq(c->ndim, 2);
    cr_assert_eq(c->shape[1], N);
    cr_assert_eq(mt_st_read_f32(c, got, N, &err), 0, "%s", err.msg);
    for (int i = 0; i < N; i++)
        cr_assert_eq(bits_of(got[i]), bits_of(mt_f16_to_f32(mt_f32_to_f16(x[i]))), "f16 %d", i);
    cr_assert_eq(got[0], ldexpf(1.0f, -24));

    int64_t gi[5];
    cr_assert_eq(mt_st_read_i64(mt_st_find(&f, "d.i32"), gi, 5, &err), 0, "%s", err.msg);
    for (int i = 0; i < 5; i++) cr_assert_eq(gi[i], i32[i]);
    cr_assert_eq(mt_st_read_i64(mt_st_find(&f, "e.i64"), gi, 3, &err), 0, "%s", err.msg);
    for (int i = 0; i < 3; i++) cr_assert_eq(gi[i], i64[i]);
    cr_assert_eq(mt_st_read_f32(mt_st_find(&f, "f.raw_bf16"), got, 3, &err), 0, "%s", err.msg);
    cr_assert(got[0] == 1.0f && got[1] == -2.0f && isnan(got[2]));
    cr_assert_eq(mt_st_find(&f, "g.empty")->numel, 0);
    cr_assert_eq(mt_st_read_f32(mt_st_find(&f, "h.scalar"), got, 1, &err), 0, "%s", err.msg);
    cr_assert_eq(got[0], x[5]);

    const mt_st_tensor_info *b = mt_st_find(&f, "i.big_f16");
    float *bg = malloc(big * sizeof *bg);
    cr_assert_eq(mt_st_read_f32(b, bg, big, &err), 0, "%s", err.msg);
    for (size_t i = 0; i < big; i += 4099)
        cr_assert_eq(bg[i], mt_f16_to_f32(mt_f32_to_f16((float)i * 0.5f)), "element %zu", i);
    cr_assert_eq(bg[big - 1], mt_f16_to_f32(mt_f32_to_f16((float)(big - 1) * 0.5f)));
    free(bg);

    /* Wrong element count and wrong kind are errors, not overruns. */
    cr_assert_eq(mt_st_read_f32(mt_st_find(&f, "a.f32"), got, N - 1, &err), -1);
    cr_assert(strstr(err.msg, "a.f32"), "%s", err.msg);
    cr_assert_eq(mt_st_read_i64(mt_st_find(&f, "a.f32"), gi, N, &err), -1);
    cr_assert_eq(mt_st_read_f32(mt_st_find(&f, "d.i32"), got, 5, &err), -1);
    mt_st_close(&f);
    free(path);
}

Test(safetensors, writer_rejects_bad_descriptions, .init = setup, .fini = teardown) {
    float x[4] = {0};
    char *path = tmp_path("bad.safetensors");
    mt_error err;
    mt_st_write_tensor dup[] = {
        {.name = "w", .dtype = MT_DTYPE_F32, .ndim = 1, .shape = {4}, .f32 = x},
        {.name = "w", .dtype = MT_DTYPE_F32, .ndim = 1, .shape = {4}, .f32 = x},
    };
    cr_assert_eq(mt_st_write(path, dup, 2, NULL, 0, &err), -1);
    cr_assert(strstr(err.msg, "'w' is given twice"), "%s", err.msg);
    mt_st_write_tensor two_sources = {.name = "w", .dtype = MT_DTYPE_F32, .ndim = 1,
                                      .shape = {4}, .f32 = x, .raw = x};
    cr_assert_eq(mt_st_write(path, &two_sources, 1, NULL, 0, &err), -1);
    mt_st_write_tensor int_from_f32 = {.name = "w", .dtype = MT_DTYPE_I32, .ndim = 1,
                                       .shape = {4}, .f32 = x};
    cr_assert_eq(mt_st_write(path, &int_from_f32, 1, NULL, 0, &err), -1);
    mt_st_write_tensor f64 = {.name = "w", .dtype = MT_DTYPE_F64, .ndim = 1, .shape = {2},
                              .raw = x};
    cr_assert_eq(mt_st_write(path, &f64, 1, NULL, 0, &err), -1);
    mt_st_write_tensor neg = {.name = "w", .dtype = MT_DTYPE_F32, .ndim = 1, .shape = {-4},
                              .f32 = x};
    cr_assert_eq(mt_st_write(path, &neg, 1, NULL, 0, &err), -1);
    cr_assert_not(mt_file_exists(path), "a failed write left a file behind");
    free(path);
}

/* A source that fails midway leaves neither the final file nor a temporary. */
Test(safetensors, failed_write_leaves_no_file, .init = setup, .fini = teardown) {
    float x[4] = {1, 2, 3, 4};
    mt_st_write_tensor t[] = {
        {.name = "ok", .dtype = MT_DTYPE_F32, .ndim = 1, .shape = {4}, .f32 = x},
        {.name = "broken", .dtype = MT_DTYPE_BF16, .ndim = 1, .shape = {4}, .fill = fill_fails},
    };
    char *path = tmp_path("model.safetensors");
    mt_error err;
    cr_assert_eq(mt_st_write(path, t, 2, NULL, 0, &err), -1);
    cr_assert(strstr(err.msg, "source unavailable") && strstr(err.msg, "broken"), "%s", err.msg);
    char cmd[4200];
    snprintf(cmd, sizeof cmd, "test -z \"$(ls -A '%s')\"", tmp);
    cr_assert_eq(system(cmd), 0, "directory not empty after a failed write");
    free(path);
}

/* ---- sharded models ---------------------------------------------------- */

/* Five tensors of 40, 40, 40, 200, 8 bytes with a 100-byte limit: shards
 * {a,b} {c} {big} {e} — in order, the oversized one alone. */
static void make_sharded_tensors(mt_st_write_tensor *t, const float *x) {
    const char *names[5] = {"layers.0.w", "layers.0.b", "layers.1.w", "big", "embed"};
    int64_t sizes[5] = {10, 10, 10, 50, 2};
    for (int i = 0; i < 5; i++)
        t[i] = (mt_st_write_tensor){.name = names[i], .dtype = MT_DTYPE_F32, .ndim = 1,
                                    .shape = {sizes[i]}, .f32 = x + 10 * i};
}

Test(safetensors, sharded_write_and_read_back, .init = setup, .fini = teardown) {
    float x[100];
    mt_test_fill_uniform(x, 100, 3, -1.0f, 1.0f);
    mt_st_write_tensor t[5];
    make_sharded_tensors(t, x);
    /* A stale single file must not survive next to the new shards. */
    char *stale = tmp_path("model.safetensors");
    write_bytes(stale, "old", 3);
    mt_st_kv meta = {"format", "pt"};
    mt_error err;
    cr_assert_eq(mt_st_write_sharded(tmp, t, 5, &meta, 1, 100, &err), 0, "%s", err.msg);
    cr_assert_not(mt_file_exists(stale));

    char *idx_path = tmp_path("model.safetensors.index.json");
    char *text;
    size_t len;
    cr_assert_eq(mt_read_file(idx_path, &text, &len, &err), 0, "%s", err.msg);
    /* Byte for byte what json.dumps(index, indent=2, sort_keys=True) + "\n"
     * gives in transformers' save_pretrained. */
    const char *want =
        "{\n"
        "  \"metadata\": {\n"
        "    \"total_parameters\": 82,\n"
        "    \"total_size\": 328\n"
        "  },\n"
        "  \"weight_map\": {\n"
        "    \"big\": \"model-00003-of-00004.safetensors\",\n"
        "    \"embed\": \"model-00004-of-00004.safetensors\",\n"
        "    \"layers.0.b\": \"model-00001-of-00004.safetensors\",\n"
        "    \"layers.0.w\": \"model-00001-of-00004.safetensors\",\n"
        "    \"layers.1.w\": \"model-00002-of-00004.safetensors\"\n"
        "  }\n"
        "}\n";
    cr_assert_str_eq(text, want);
    free(text);

    mt_st_model m;
    cr_assert_eq(mt_st_model_open(&m, tmp, &err), 0, "%s", err.msg);
    cr_assert_eq(m.n_files, 4);
    cr_assert_eq(m.n_tensors, 5);
    for (int i = 0; i < 5; i++) {
        const mt_st_tensor_info *ti = mt_st_model_find(&m, t[i].name);
        cr_assert(ti, "%s not found", t[i].name);
        float got[50];
        cr_assert_eq(mt_st_read_f32(ti, got, ti->numel, &err), 0, "%s", err.msg);
        cr_assert_eq(memcmp(got, t[i].f32, ti->numel * sizeof(float)), 0, "%s", t[i].name);
    }
    cr_assert_null(mt_st_model_find(&m, "nope"));
    cr_assert_str_eq(mt_st_meta(&m.files[0], "format"), "pt");
    mt_st_model_close(&m);

    /* Rewriting as one file removes the index, which would take precedence. */
    cr_assert_eq(mt_st_write_sharded(tmp, t, 5, &meta, 1, (size_t)5 << 30, &err), 0, "%s",
                 err.msg);
    cr_assert_not(mt_file_exists(idx_path));
    cr_assert(mt_file_exists(stale));
    cr_assert_eq(mt_st_model_open(&m, tmp, &err), 0, "%s", err.msg);
    cr_assert_eq(m.n_files, 1);
    cr_assert_eq(m.n_tensors, 5);
    cr_assert(mt_st_model_find(&m, "big"));
    mt_st_model_close(&m);
    free(stale);
    free(idx_path);
}

static void write_file_text(const char *name, const char *text) {
    char *p = tmp_path(name);
    write_bytes(p, text, strlen(text));
    free(p);
}

static void write_one_tensor_file(const char *name, const char *tensor) {
    float x[2] = {1, 2};
    mt_st_write_tensor t = {.name = tensor, .dtype = MT_DTYPE_F32, .ndim = 1, .shape = {2},
                            .f32 = x};
    char *p = tmp_path(name);
    mt_error err;
    cr_assert_eq(mt_st_write(p, &t, 1, NULL, 0, &err), 0, "%s", err.msg);
    free(p);
}

static void expect_model_error(const char *sub1, const char *sub2) {
    mt_st_model m;
    mt_error err = {{0}};
    cr_assert_eq(mt_st_model_open(&m, tmp, &err), -1);
    cr_assert(strstr(err.msg, sub1), "message lacks '%s': %s", sub1, err.msg);
    if (sub2) cr_assert(strstr(err.msg, sub2), "message lacks '%s': %s", sub2, err.msg);
    cr_assert_null(m.files);
}

Test(safetensors, model_dir_without_weights, .init = setup, .fini = teardown) {
    expect_model_error(tmp, "model.safetensors");
}

Test(safetensors, model_index_names_missing_shard, .init = setup, .fini = teardown) {
    write_one_tensor_file("model-00001-of-00002.safetensors", "a");
    write_file_text("model.safetensors.index.json",
                    "{\"metadata\": {}, \"weight_map\": {"
                    "\"a\": \"model-00001-of-00002.safetensors\","
                    "\"b\": \"model-00002-of-00002.safetensors\"}}");
    expect_model_error("model-00002-of-00002.safetensors", "does not exist");
}

Test(safetensors, model_index_tensor_absent_from_shard, .init = setup, .fini = teardown) {
    write_one_tensor_file("model-00001-of-00001.safetensors", "a");
    write_file_text("model.safetensors.index.json",
                    "{\"weight_map\": {\"a\": \"model-00001-of-00001.safetensors\","
                    "\"ghost\": \"model-00001-of-00001.safetensors\"}}");
    expect_model_error("'ghost' is not in its shard", NULL);
}

Test(safetensors, model_index_rejects_paths_outside_dir, .init = setup, .fini = teardown) {
    write_file_text("model.safetensors.index.json",
                    "{\"weight_map\": {\"a\": \"../etc/passwd\"}}");
    expect_model_error("not a file name in the model directory", NULL);
}

Test(safetensors, model_index_without_weight_map, .init = setup, .fini = teardown) {
    write_file_text("model.safetensors.index.json", "{\"metadata\": {}}");
    expect_model_error("weight_map", NULL);
}

/* ---- malformed files: each a clear error, never a crash ---------------- */

Test(st_malformed, shorter_than_8_bytes, .init = setup, .fini = teardown) {
    char *p = tmp_path("short.safetensors");
    write_bytes(p, "\x10\0\0\0\0", 5);
    expect_open_error(p, "shorter than the 8-byte header length", NULL);
    free(p);
}

Test(st_malformed, header_length_past_end, .init = setup, .fini = teardown) {
    unsigned char b[16] = {100};  /* says 100 header bytes, has 8 */
    memcpy(b + 8, "{}      ", 8);
    char *p = tmp_path("x.safetensors");
    write_bytes(p, b, sizeof b);
    expect_open_error(p, "header length 100 runs past the end", NULL);
    free(p);
}

Test(st_malformed, header_length_absurd, .init = setup, .fini = teardown) {
    unsigned char b[16] = {0, 0, 0, 0, 0, 0, 0, 0x80};
    char *p = tmp_path("x.safetensors");
    write_bytes(p, b, sizeof b);
    expect_open_error(p, "is absurd", NULL);
    free(p);
}

Test(st_malformed, header_not_json, .init = setup, .fini = teardown) {
    expect_header_error("{\"a\": {\"dtype\": \"F32\",", 0, "not valid JSON", NULL);
}

Test(st_malformed, header_not_object, .init = setup, .fini = teardown) {
    expect_header_error("[1, 2, 3]", 0, "not an object", NULL);
}

Test(st_malformed, garbage_after_header, .init = setup, .fini = teardown) {
    expect_header_error("{}  xyz", 0, "unexpected bytes after the header JSON", NULL);
}

Test(st_malformed, entry_not_object, .init = setup, .fini = teardown) {
    expect_header_error("{\"w\": [1, 2]}", 0, "'w' is not an object", NULL);
}

Test(st_malformed, missing_dtype, .init = setup, .fini = teardown) {
    expect_header_error("{\"w\": {\"shape\": [2], \"data_offsets\": [0, 8]}}", 8,
                        "\"dtype\" is missing", "'w'");
}

Test(st_malformed, dtype_wrong_type, .init = setup, .fini = teardown) {
    expect_header_error("{\"w\": {\"dtype\": 32, \"shape\": [2], \"data_offsets\": [0, 8]}}",
                        8, "\"dtype\" is not a string", NULL);
}

Test(st_malformed, missing_shape, .init = setup, .fini = teardown) {
    expect_header_error("{\"w\": {\"dtype\": \"F32\", \"data_offsets\": [0, 8]}}", 8,
                        "\"shape\" is missing", NULL);
}

Test(st_malformed, shape_wrong_type, .init = setup, .fini = teardown) {
    expect_header_error("{\"w\": {\"dtype\": \"F32\", \"shape\": \"2\", \"data_offsets\": [0, 8]}}",
                        8, "\"shape\" is not an array", NULL);
}

Test(st_malformed, missing_data_offsets, .init = setup, .fini = teardown) {
    expect_header_error("{\"w\": {\"dtype\": \"F32\", \"shape\": [2]}}", 8,
                        "\"data_offsets\" is missing", NULL);
}

Test(st_malformed, data_offsets_wrong_type, .init = setup, .fini = teardown) {
    expect_header_error("{\"w\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 4, 8]}}",
                        8, "\"data_offsets\" is malformed", NULL);
    expect_header_error("{\"w\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, \"8\"]}}",
                        8, "\"data_offsets\" is malformed", NULL);
    expect_header_error("{\"w\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [-8, 0]}}",
                        8, "\"data_offsets\" is malformed", NULL);
}

Test(st_malformed, negative_dim, .init = setup, .fini = teardown) {
    expect_header_error("{\"w\": {\"dtype\": \"F32\", \"shape\": [2, -1], \"data_offsets\": [0, 8]}}",
                        8, "shape[1] is not a non-negative integer", NULL);
}

Test(st_malformed, non_integer_dim, .init = setup, .fini = teardown) {
    expect_header_error("{\"w\": {\"dtype\": \"F32\", \"shape\": [1.5], \"data_offsets\": [0, 8]}}",
                        8, "shape[0] is not a non-negative integer", NULL);
    expect_header_error("{\"w\": {\"dtype\": \"F32\", \"shape\": [1e300], \"data_offsets\": [0, 8]}}",
                        8, "shape[0] is not a non-negative integer", NULL);
}

Test(st_malformed, too_many_dims, .init = setup, .fini = teardown) {
    expect_header_error("{\"w\": {\"dtype\": \"U8\", \"shape\": [1,1,1,1,1,1,1,1,1], "
                        "\"data_offsets\": [0, 1]}}", 1, "9 dimensions", NULL);
}

Test(st_malformed, shape_product_overflow, .init = setup, .fini = teardown) {
    /* Each dim is a valid integer (2^40 < 2^53) but the product is 2^80. */
    expect_header_error("{\"w\": {\"dtype\": \"F32\", \"shape\": [1099511627776, 1099511627776], "
                        "\"data_offsets\": [0, 8]}}", 8, "overflows", NULL);
    /* numel fits, bytes do not: 2^62 elements of 4 bytes. */
    expect_header_error("{\"w\": {\"dtype\": \"F32\", \"shape\": [4194304, 1099511627776], "
                        "\"data_offsets\": [0, 8]}}", 8, "overflows", NULL);
}

Test(st_malformed, data_offsets_out_of_range, .init = setup, .fini = teardown) {
    expect_header_error("{\"w\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [1000, 1008]}}",
                        8, "needs bytes [1000, 1008)", "holds only 8 bytes");
}

Test(st_malformed, begin_after_end, .init = setup, .fini = teardown) {
    expect_header_error("{\"w\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [8, 0]}}",
                        8, "begin > end", NULL);
}

Test(st_malformed, overlapping_tensors, .init = setup, .fini = teardown) {
    expect_header_error("{\"a\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]},"
                        " \"b\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [4, 12]}}",
                        12, "overlap", "'a'");
}

Test(st_malformed, byte_size_disagrees_with_shape, .init = setup, .fini = teardown) {
    expect_header_error("{\"w\": {\"dtype\": \"BF16\", \"shape\": [2, 3], \"data_offsets\": [0, 24]}}",
                        24, "span 24 bytes but 6 elements of BF16 take 12 bytes", NULL);
}

Test(st_malformed, unknown_dtype, .init = setup, .fini = teardown) {
    expect_header_error("{\"w\": {\"dtype\": \"Q7\", \"shape\": [2], \"data_offsets\": [0, 2]}}",
                        2, "unknown dtype \"Q7\"", "'w'");
}

Test(st_malformed, duplicate_names, .init = setup, .fini = teardown) {
    expect_header_error("{\"w\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4]},"
                        " \"w\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [4, 8]}}",
                        8, "'w' appears twice", NULL);
}

Test(st_malformed, metadata_not_strings, .init = setup, .fini = teardown) {
    expect_header_error("{\"__metadata__\": {\"format\": 1}}", 0, "__metadata__", "not a string");
    expect_header_error("{\"__metadata__\": [1]}", 0, "__metadata__", "not an object");
}

/* A valid file cut short: the data section no longer holds the last tensor. */
Test(st_malformed, truncated_file, .init = setup, .fini = teardown) {
    float x[64] = {0};
    mt_st_write_tensor t[] = {
        {.name = "first", .dtype = MT_DTYPE_F32, .ndim = 1, .shape = {64}, .f32 = x},
        {.name = "last", .dtype = MT_DTYPE_BF16, .ndim = 2, .shape = {8, 8}, .f32 = x},
    };
    char *p = tmp_path("t.safetensors");
    mt_error err;
    cr_assert_eq(mt_st_write(p, t, 2, NULL, 0, &err), 0, "%s", err.msg);
    struct stat st;
    cr_assert_eq(stat(p, &st), 0);
    cr_assert_eq(truncate(p, st.st_size - 1), 0);
    expect_open_error(p, "'last'", "truncated");
    free(p);
}

/* Dtypes megatrain does not convert are listed; reading them says what to do. */
Test(st_malformed, unsupported_dtype_listed_but_not_read, .init = setup, .fini = teardown) {
    char *p = make_st("{\"d\": {\"dtype\": \"F64\", \"shape\": [2], \"data_offsets\": [0, 16]},"
                      " \"q\": {\"dtype\": \"F4\", \"shape\": [4], \"data_offsets\": [16, 18]}}",
                      18);
    mt_st_file f;
    mt_error err;
    cr_assert_eq(mt_st_open(&f, p, &err), 0, "%s", err.msg);
    const mt_st_tensor_info *d = mt_st_find(&f, "d");
    cr_assert_eq(d->dtype, MT_DTYPE_F64);
    cr_assert_eq(mt_st_find(&f, "q")->nbytes, 2);
    float out[2];
    cr_assert_eq(mt_st_read_f32(d, out, 2, &err), -1);
    cr_assert(strstr(err.msg, "unsupported dtype F64 for tensor 'd' in "), "%s", err.msg);
    cr_assert(strstr(err.msg, p) && strstr(err.msg, "F32, BF16, F16"), "%s", err.msg);
    mt_st_close(&f);
    free(p);
}
