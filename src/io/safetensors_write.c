/* safetensors writer: one file, or a model directory split into shards with
 * transformers' index. Only the JSON header is built in memory; tensor data
 * streams from the caller's fp32 arrays (narrowed in chunks), raw bytes or
 * fill callbacks straight to the file. */
#include "io/safetensors.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "io/file.h"
#include "util/mem.h"

/* Elements converted per chunk: 4 MiB of fp32, large enough that write()
 * calls are cheap, small enough to stay in cache-friendly scratch. */
#define CHUNK ((size_t)1 << 20)

/* ---- a growable string for headers and the index ----------------------- */

typedef struct strbuf {
    char *p;
    size_t len, cap;
} strbuf;

static void sb_putn(strbuf *b, const char *s, size_t n) {
    if (b->len + n + 1 > b->cap) {
        b->cap = (b->len + n + 1) * 2;
        b->p = mt_realloc_or_die(b->p, b->cap);
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
}

static void sb_puts(strbuf *b, const char *s) { sb_putn(b, s, strlen(s)); }

static void sb_printf(strbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_printf(strbuf *b, const char *fmt, ...) {
    char tmp[256];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    MT_ASSERT(n >= 0 && (size_t)n < sizeof tmp);
    sb_putn(b, tmp, (size_t)n);
}

/* A JSON string literal: quotes, backslashes and control bytes escaped;
 * other UTF-8 passes through. */
static void sb_json_str(strbuf *b, const char *s) {
    sb_putn(b, "\"", 1);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') {
            char e[2] = {'\\', (char)c};
            sb_putn(b, e, 2);
        } else if (c < 0x20) {
            sb_printf(b, "\\u%04x", c);
        } else {
            sb_putn(b, (const char *)&c, 1);
        }
    }
    sb_putn(b, "\"", 1);
}

/* ---- validation -------------------------------------------------------- */

static bool writable_dtype(mt_dtype dt) {
    return mt_dtype_is_float(dt) || dt == MT_DTYPE_I32 || dt == MT_DTYPE_I64;
}

/* Checks one tensor description and computes its byte size. */
static int check_tensor(const mt_st_write_tensor *t, size_t *nbytes, mt_error *err) {
    const char *name = t->name ? t->name : "(null)";
    if (!t->name || !*t->name || strcmp(t->name, "__metadata__") == 0)
        return mt_errorf(err, "cannot write a tensor named '%s'", name);
    if (!writable_dtype(t->dtype))
        return mt_errorf(err, "tensor '%s': cannot write dtype %s (writable: F32, BF16, F16, "
                         "I32, I64)", name, mt_dtype_name(t->dtype));
    int sources = (t->f32 != NULL) + (t->raw != NULL) + (t->fill != NULL);
    if (sources != 1)
        return mt_errorf(err, "tensor '%s': exactly one of f32, raw, fill must be set (%d are)",
                         name, sources);
    if (!t->raw && !mt_dtype_is_float(t->dtype))
        return mt_errorf(err, "tensor '%s': fp32 data can only be written as F32, BF16, F16; "
                         "pass %s data through raw", name, mt_dtype_name(t->dtype));
    if (t->ndim < 0 || t->ndim > MT_ST_MAX_DIMS)
        return mt_errorf(err, "tensor '%s': ndim %d is outside 0..%d", name, t->ndim,
                         MT_ST_MAX_DIMS);
    size_t n = (size_t)mt_dtype_bits(t->dtype) / 8;
    for (int i = 0; i < t->ndim; i++)
        if (t->shape[i] < 0 || !mt_mul_size(n, (size_t)t->shape[i], &n))
            return mt_errorf(err, "tensor '%s': shape[%d] = %lld is negative or overflows",
                             name, i, (long long)t->shape[i]);
    *nbytes = n;
    return 0;
}

static int cmp_str_ptr(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Checks every tensor, the names being unique; fills nbytes[i]. */
static int check_all(const mt_st_write_tensor *t, int n, size_t *nbytes, mt_error *err) {
    for (int i = 0; i < n; i++)
        if (check_tensor(&t[i], &nbytes[i], err)) return -1;
    const char **names = mt_malloc_or_die(((size_t)n + 1) * sizeof *names);
    for (int i = 0; i < n; i++) names[i] = t[i].name;
    qsort(names, (size_t)n, sizeof *names, cmp_str_ptr);
    int rc = 0;
    for (int i = 1; i < n && rc == 0; i++)
        if (strcmp(names[i], names[i - 1]) == 0)
            rc = mt_errorf(err, "tensor name '%s' is given twice", names[i]);
    free(names);
    return rc;
}

/* ---- one file ---------------------------------------------------------- */

/* The header JSON, padded with spaces to a multiple of 8 bytes like the
 * reference writer, so that the data section starts 8-byte aligned. */
static void build_header(strbuf *b, const mt_st_write_tensor *t, int n, const size_t *nbytes,
                         const mt_st_kv *meta, int n_meta) {
    sb_puts(b, "{");
    if (n_meta > 0) {
        sb_puts(b, "\"__metadata__\":{");
        for (int i = 0; i < n_meta; i++) {
            if (i) sb_puts(b, ",");
            sb_json_str(b, meta[i].key);
            sb_puts(b, ":");
            sb_json_str(b, meta[i].value);
        }
        sb_puts(b, "}");
    }
    size_t off = 0;
    for (int i = 0; i < n; i++) {
        if (i || n_meta > 0) sb_puts(b, ",");
        sb_json_str(b, t[i].name);
        sb_printf(b, ":{\"dtype\":\"%s\",\"shape\":[", mt_dtype_name(t[i].dtype));
        for (int d = 0; d < t[i].ndim; d++)
            sb_printf(b, "%s%lld", d ? "," : "", (long long)t[i].shape[d]);
        sb_printf(b, "],\"data_offsets\":[%zu,%zu]}", off, off + nbytes[i]);
        off += nbytes[i];
    }
    sb_puts(b, "}");
    while (b->len % 8) sb_puts(b, " ");
}

/* Scratch for narrowing: CHUNK fp32 values and their 16-bit forms. */
typedef struct scratch {
    float *f32;       // (CHUNK)
    uint16_t *h16;    // (CHUNK)
} scratch;

static int write_tensor_data(int fd, const char *path, const mt_st_write_tensor *t,
                             size_t nbytes, scratch *s, mt_error *err) {
    if (t->raw) return mt_write_all(fd, t->raw, nbytes, path, err);
    size_t esize = (size_t)mt_dtype_bits(t->dtype) / 8;
    size_t numel = nbytes / esize;
    for (size_t i = 0; i < numel; i += CHUNK) {
        size_t k = numel - i < CHUNK ? numel - i : CHUNK;
        const float *x = t->f32 ? t->f32 + i : s->f32;
        if (t->fill && t->fill(t->fill_ctx, t, i, k, s->f32, err))
            return mt_error_prefix(err, "%s: producing tensor '%s': ", path, t->name);
        const void *out = x;
        if (t->dtype == MT_DTYPE_BF16) mt_f32_to_bf16_array(x, s->h16, k);
        if (t->dtype == MT_DTYPE_F16) mt_f32_to_f16_array(x, s->h16, k);
        if (t->dtype != MT_DTYPE_F32) out = s->h16;
        if (mt_write_all(fd, out, k * esize, path, err)) return -1;
    }
    return 0;
}

/* Writes t[0..n) (already checked, sizes in nbytes) to path atomically. */
static int write_file(const char *path, const mt_st_write_tensor *t, int n,
                      const size_t *nbytes, const mt_st_kv *meta, int n_meta, scratch *s,
                      mt_error *err) {
    strbuf hdr = {0};
    build_header(&hdr, t, n, nbytes, meta, n_meta);
    mt_atomic_file af;
    if (mt_atomic_open(&af, path, err)) {
        free(hdr.p);
        return -1;
    }
    uint64_t hlen = hdr.len;  /* little-endian host: the bytes are the format */
    int rc = mt_write_all(af.fd, &hlen, 8, path, err);
    if (rc == 0) rc = mt_write_all(af.fd, hdr.p, hdr.len, path, err);
    for (int i = 0; i < n && rc == 0; i++)
        rc = write_tensor_data(af.fd, path, &t[i], nbytes[i], s, err);
    free(hdr.p);
    if (rc) {
        mt_atomic_abort(&af);
        return -1;
    }
    return mt_atomic_commit(&af, err);
}

static void scratch_init(scratch *s) {
    s->f32 = mt_malloc_or_die(CHUNK * sizeof(float));
    s->h16 = mt_malloc_or_die(CHUNK * sizeof(uint16_t));
}

static void scratch_free(scratch *s) {
    free(s->f32);
    free(s->h16);
}

int mt_st_write(const char *path, const mt_st_write_tensor *t, int n, const mt_st_kv *meta,
                int n_meta, mt_error *err) {
    size_t *nbytes = mt_malloc_or_die(((size_t)n + 1) * sizeof *nbytes);
    int rc = check_all(t, n, nbytes, err);
    if (rc == 0) {
        scratch s;
        scratch_init(&s);
        rc = write_file(path, t, n, nbytes, meta, n_meta, &s, err);
        scratch_free(&s);
    }
    free(nbytes);
    if (rc) mt_error_prefix(err, "writing %s: ", path);
    return rc;
}

/* ---- sharded model ----------------------------------------------------- */

/* first[k] = index of the first tensor of shard k; returns the shard count.
 * Consecutive tensors fill a shard until the next would pass max; a tensor
 * larger than max alone makes a shard. */
static int split_shards(const size_t *nbytes, int n, size_t max, int *first) {
    int n_shards = 0, in_shard = 0;
    size_t cur = 0;  /* bytes in the current shard */
    for (int i = 0; i < n; i++) {
        bool over = cur > max || nbytes[i] > max - cur;
        if (n_shards == 0 || (in_shard > 0 && over)) {
            first[n_shards++] = i;
            cur = 0;
            in_shard = 0;
        }
        cur += nbytes[i];
        in_shard++;
    }
    if (n_shards == 0) first[n_shards++] = 0;
    first[n_shards] = n;
    return n_shards;
}

typedef struct wm_entry {
    const char *name;
    int shard;
} wm_entry;

static int cmp_wm(const void *a, const void *b) {
    return strcmp(((const wm_entry *)a)->name, ((const wm_entry *)b)->name);
}

/* The index as transformers writes it: json.dumps(indent=2, sort_keys=True). */
static void build_index(strbuf *b, const mt_st_write_tensor *t, int n, const size_t *nbytes,
                        const int *first, int n_shards) {
    size_t total_size = 0, total_params = 0;
    wm_entry *wm = mt_malloc_or_die(((size_t)n + 1) * sizeof *wm);
    for (int k = 0; k < n_shards; k++)
        for (int i = first[k]; i < first[k + 1]; i++) wm[i] = (wm_entry){t[i].name, k};
    for (int i = 0; i < n; i++) {
        total_size += nbytes[i];
        total_params += nbytes[i] / ((size_t)mt_dtype_bits(t[i].dtype) / 8);
    }
    qsort(wm, (size_t)n, sizeof *wm, cmp_wm);
    sb_printf(b, "{\n  \"metadata\": {\n    \"total_parameters\": %zu,\n"
              "    \"total_size\": %zu\n  },\n  \"weight_map\": {\n", total_params, total_size);
    for (int i = 0; i < n; i++) {
        sb_puts(b, "    ");
        sb_json_str(b, wm[i].name);
        sb_printf(b, ": \"model-%05d-of-%05d.safetensors\"%s\n", wm[i].shard + 1, n_shards,
                  i + 1 < n ? "," : "");
    }
    sb_puts(b, "  }\n}\n");
    free(wm);
}

static int write_index(const char *dir, const strbuf *idx, mt_error *err) {
    char *path = mt_path_join(dir, "model.safetensors.index.json");
    mt_atomic_file af;
    int rc = mt_atomic_open(&af, path, err);
    if (rc == 0) {
        rc = mt_write_all(af.fd, idx->p, idx->len, path, err);
        if (rc) mt_atomic_abort(&af);
        else rc = mt_atomic_commit(&af, err);
    }
    free(path);
    return rc;
}

/* Removes dir/name if present: a file of the other layout left by an older
 * save would otherwise take precedence (the index) or linger (the single). */
static void remove_stale(const char *dir, const char *name) {
    char *p = mt_path_join(dir, name);
    if (mt_file_exists(p)) unlink(p);
    free(p);
}

int mt_st_write_sharded(const char *dir, const mt_st_write_tensor *t, int n,
                        const mt_st_kv *meta, int n_meta, size_t max_shard_bytes,
                        mt_error *err) {
    size_t *nbytes = mt_malloc_or_die(((size_t)n + 1) * sizeof *nbytes);
    int *first = mt_malloc_or_die(((size_t)n + 2) * sizeof *first);
    int rc = check_all(t, n, nbytes, err);
    if (rc) mt_error_prefix(err, "writing model to %s: ", dir);
    int n_shards = rc ? 0 : split_shards(nbytes, n, max_shard_bytes, first);
    scratch s;
    scratch_init(&s);
    for (int k = 0; k < n_shards && rc == 0; k++) {
        char name[64];
        if (n_shards == 1) snprintf(name, sizeof name, "model.safetensors");
        else snprintf(name, sizeof name, "model-%05d-of-%05d.safetensors", k + 1, n_shards);
        char *path = mt_path_join(dir, name);
        rc = write_file(path, t + first[k], first[k + 1] - first[k], nbytes + first[k], meta,
                        n_meta, &s, err);
        if (rc) mt_error_prefix(err, "writing %s: ", path);
        free(path);
    }
    scratch_free(&s);
    if (rc == 0 && n_shards > 1) {
        strbuf idx = {0};
        build_index(&idx, t, n, nbytes, first, n_shards);
        rc = write_index(dir, &idx, err);
        free(idx.p);
        if (rc == 0) remove_stale(dir, "model.safetensors");
    } else if (rc == 0) {
        remove_stale(dir, "model.safetensors.index.json");
    }
    free(nbytes);
    free(first);
    return rc;
}
