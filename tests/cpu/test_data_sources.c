/* Data sources: gzip and zstd JSONL give the tokens and batches of the
 * same plain JSONL (zlib and libzstd write the compressed files here, in
 * one or several members/frames, larger than the reader's 1 MiB chunks);
 * corrupt, truncated and unsupported compressions are errors naming the
 * file; a directory of shards equals the concatenation of its files in
 * name order; bad directories are errors naming the fix. Every comparison
 * is exact. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <zlib.h>
#include <zstd.h>

#include "data/dataset.h"
#include "io/file.h"
#include "testlib.h"

static void write_bytes(const char *path, const void *p, size_t n) {
    FILE *f = fopen(path, "wb");
    cr_assert(f, "%s", path);
    cr_assert_eq(fwrite(p, 1, n, f), n);
    fclose(f);
}

static char *read_bytes(const char *path, size_t *n) {
    char *buf;
    mt_error err;
    cr_assert_eq(mt_read_file(path, &buf, n, &err), 0, "%s", err.msg);
    return buf;
}

/* text (n bytes) as gzip in `members` members, one after the other. */
static void write_gzip(const char *path, const char *text, size_t n, int members) {
    FILE *f = fopen(path, "wb");
    cr_assert(f);
    for (int m = 0; m < members; m++) {
        size_t a = n * (size_t)m / (size_t)members, b = n * (size_t)(m + 1) / (size_t)members;
        z_stream z = {0};
        cr_assert_eq(deflateInit2(&z, 6, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY), Z_OK);
        uLong cap = deflateBound(&z, (uLong)(b - a));
        unsigned char *out = malloc(cap);
        z.next_in = (Bytef *)text + a, z.avail_in = (uInt)(b - a);
        z.next_out = out, z.avail_out = (uInt)cap;
        cr_assert_eq(deflate(&z, Z_FINISH), Z_STREAM_END);
        fwrite(out, 1, cap - z.avail_out, f);
        deflateEnd(&z);
        free(out);
    }
    fclose(f);
}

/* text as zstd in `frames` frames, each with its content checksum. */
static void write_zstd(const char *path, const char *text, size_t n, int frames) {
    FILE *f = fopen(path, "wb");
    cr_assert(f);
    ZSTD_CCtx *c = ZSTD_createCCtx();
    ZSTD_CCtx_setParameter(c, ZSTD_c_checksumFlag, 1);
    for (int k = 0; k < frames; k++) {
        size_t a = n * (size_t)k / (size_t)frames, b = n * (size_t)(k + 1) / (size_t)frames;
        size_t cap = ZSTD_compressBound(b - a);
        void *out = malloc(cap);
        size_t got = ZSTD_compress2(c, out, cap, text + a, b - a);
        cr_assert(!ZSTD_isError(got));
        fwrite(out, 1, got, f);
        free(out);
    }
    ZSTD_freeCCtx(c);
    fclose(f);
}

static mt_tokenizer *tiny_tokenizer(void) {
    char *tp = mt_path_join(mt_test_fixtures_dir(), "tokenizer/tiny_bytelevel.json");
    mt_error err;
    mt_tokenizer *tok = mt_tokenizer_load(tp, &err);
    cr_assert(tok, "%s", err.msg);
    free(tp);
    return tok;
}

static mt_dataset *open_path(const char *path, const mt_tokenizer *tok, mt_error *err) {
    mt_data_opts o = {.path = path, .format = "auto", .seed = 11, .epochs = 2};
    return mt_dataset_open(&o, tok, (int64_t)mt_tokenizer_vocab_size(tok), err);
}

/* Same corpus (tokens and loss flags) and the same batches to the end. */
static void assert_same_data(mt_dataset *a, mt_dataset *b, const char *what) {
    const mt_mtok *x = mt_dataset_corpus(a), *y = mt_dataset_corpus(b);
    cr_assert_eq(x->n_docs, y->n_docs, "%s: documents", what);
    cr_assert_eq(x->n_tokens, y->n_tokens, "%s: tokens", what);
    for (uint64_t d = 0; d <= x->n_docs; d++)
        cr_assert_eq(x->offsets[d], y->offsets[d], "%s: document %llu", what, (unsigned long long)d);
    for (uint64_t i = 0; i < x->n_tokens; i++)
        cr_assert(mt_mtok_token(x, i) == mt_mtok_token(y, i) &&
                  mt_mtok_trainable(x, i) == mt_mtok_trainable(y, i), "%s: token %llu", what,
                  (unsigned long long)i);
    enum { B = 4, T = 32 };
    int32_t xa[B * T], ya[B * T], xb[B * T], yb[B * T];
    int n = 0, ra, rb;
    while ((ra = mt_dataset_next_batch(a, B, T, xa, ya, NULL)) == 0 &&
           (rb = mt_dataset_next_batch(b, B, T, xb, yb, NULL)) == 0) {
        cr_assert(!memcmp(xa, xb, sizeof xa) && !memcmp(ya, yb, sizeof ya), "%s: batch %d", what, n);
        n++;
    }
    cr_assert_eq(ra, 1, "%s: one ran out first", what);
    cr_assert_eq(mt_dataset_next_batch(b, B, T, xb, yb, NULL), 1, "%s: one ran out first", what);
    cr_assert_gt(n, 10);
}

/* sample.jsonl (every kind of text the tokenizer tests use) repeated into
 * more than 3 MB, so the decompressed data spans several reader chunks. */
static char *big_jsonl(size_t *n) {
    char *p = mt_path_join(mt_test_fixtures_dir(), "tokenizer/sample.jsonl");
    size_t len;
    char *one = read_bytes(p, &len);
    free(p);
    enum { REPEAT = 100 };
    char *all = malloc(len * REPEAT + 1);
    for (int i = 0; i < REPEAT; i++) memcpy(all + len * (size_t)i, one, len);
    *n = len * REPEAT;
    all[*n] = 0;
    free(one);
    return all;
}

Test(data_sources, gzip_and_zstd_give_the_plain_tokens, .timeout = MT_TEST_LIMIT(120)) {
    char *dir = mt_test_tmpdir();
    mt_tokenizer *tok = tiny_tokenizer();
    size_t n;
    char *text = big_jsonl(&n);
    cr_assert_gt(n, (size_t)3 << 20);
    char *plain = mt_path_join(dir, "d.jsonl");
    write_bytes(plain, text, n);
    struct { const char *name; int gz, parts; } cases[] = {
        {"d.jsonl.gz", 1, 1}, {"d2.jsonl.gz", 1, 3}, {"d.jsonl.zst", 0, 1}, {"d2.jsonl.zst", 0, 4},
        {"gz-without-suffix.jsonl", 1, 1},  // the bytes tell the compression
    };
    mt_error err = {{0}};
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char *p = mt_path_join(dir, cases[i].name);
        if (cases[i].gz) write_gzip(p, text, n, cases[i].parts);
        else write_zstd(p, text, n, cases[i].parts);
        mt_dataset *a = open_path(plain, tok, &err), *b = open_path(p, tok, &err);
        cr_assert(a && b, "%s: %s", cases[i].name, err.msg);
        cr_assert_eq(mt_dataset_stats(b).files, 1);
        assert_same_data(a, b, cases[i].name);
        mt_dataset_free(a), mt_dataset_free(b);
        free(p);
    }
    free(plain);
    free(text);
    mt_tokenizer_free(tok);
    mt_test_rmtree(dir);
    free(dir);
}

/* Opening path fails with a message holding s1 and s2. */
static void expect_open_error(const char *path, const char *s1, const char *s2) {
    mt_tokenizer *tok = mt_tokenizer_bytes();
    mt_error err = {{0}};
    mt_data_opts o = {.path = path, .format = "auto", .seed = 1, .epochs = 1};
    mt_dataset *d = mt_dataset_open(&o, tok, 258, &err);
    cr_assert_null(d, "%s opened", path);
    cr_assert(strstr(err.msg, s1), "'%s' not in: %s", s1, err.msg);
    cr_assert(strstr(err.msg, s2), "'%s' not in: %s", s2, err.msg);
    mt_tokenizer_free(tok);
}

Test(data_sources, corrupt_and_truncated_compressed_files_are_errors_naming_them) {
    char *dir = mt_test_tmpdir();
    size_t n;
    char *text = big_jsonl(&n);
    for (int gz = 0; gz < 2; gz++) {
        char *p = mt_path_join(dir, gz ? "c.jsonl.gz" : "c.jsonl.zst");
        if (gz) write_gzip(p, text, n, 1);
        else write_zstd(p, text, n, 1);
        size_t len;
        char *z = read_bytes(p, &len);
        const char *kind = gz ? "corrupt gzip data" : "corrupt zstd data";
        /* one flipped byte in the middle of the compressed stream */
        z[len / 2] ^= 0x5a;
        write_bytes(p, z, len);
        expect_open_error(p, p, kind);
        z[len / 2] ^= 0x5a;
        /* the stored check no longer matches (last bytes: gzip size, zstd checksum) */
        z[len - 2] ^= 1;
        write_bytes(p, z, len);
        expect_open_error(p, p, kind);
        z[len - 2] ^= 1;
        /* cut short, inside the stream and inside the trailer */
        write_bytes(p, z, len / 3);
        expect_open_error(p, p, "ends early");
        write_bytes(p, z, len - 2);
        expect_open_error(p, p, "ends early");
        /* garbage after a complete stream */
        char *more = malloc(len + 8);
        memcpy(more, z, len);
        memcpy(more + len, "not data", 8);
        write_bytes(p, more, len + 8);
        expect_open_error(p, p, kind);
        free(more);
        free(z);
        free(p);
    }
    free(text);
    mt_test_rmtree(dir);
    free(dir);
}

Test(data_sources, unsupported_or_mislabelled_compression_is_an_error) {
    char *dir = mt_test_tmpdir();
    struct { const char *name, *bytes; size_t n; const char *want; } cases[] = {
        {"a.jsonl.bz2", "BZh91AY&SY", 10, "bzip2-compressed data"},
        {"a.jsonl", "\xfd" "7zXZ\0\0\0", 8, "xz-compressed data"},   // named .jsonl, bytes are xz
        {"a.jsonl.lz4", "\x04\x22\x4d\x18\0\0", 6, "lz4-compressed data"},
        {"a.zip", "PK\x03\x04\0\0", 6, "zip-compressed data"},
        {"b.jsonl.gz", "{\"text\": \"x\"}\n", 14, "the name says gzip"},
        {"b.jsonl.zst", "\x1f\x8b\x08\0\0\0", 6, "the name says zstd"},
        {"e.jsonl.gz", "", 0, "is empty"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char *p = mt_path_join(dir, cases[i].name);
        write_bytes(p, cases[i].bytes, cases[i].n);
        expect_open_error(p, p, cases[i].want);
        if (strstr(cases[i].want, "-compressed")) expect_open_error(p, "decompress it", "zstd");
        free(p);
    }
    mt_test_rmtree(dir);
    free(dir);
}

/* lines [a, b) of text (n_lines lines), as one string. */
static char *lines_of(const char *text, int a, int b) {
    const char *s = text;
    for (int i = 0; i < a; i++) s = strchr(s, '\n') + 1;
    const char *e = s;
    for (int i = a; i < b; i++) e = strchr(e, '\n') + 1;
    char *out = malloc((size_t)(e - s) + 1);
    memcpy(out, s, (size_t)(e - s));
    out[e - s] = 0;
    return out;
}

Test(data_sources, a_directory_of_shards_is_their_concatenation_in_name_order,
     .timeout = MT_TEST_LIMIT(120)) {
    char *dir = mt_test_tmpdir(), *shards = mt_path_join(dir, "shards");
    cr_assert_eq(mkdir(shards, 0755), 0);
    mt_tokenizer *tok = tiny_tokenizer();
    char *p = mt_path_join(mt_test_fixtures_dir(), "tokenizer/sample.jsonl");
    size_t len;
    char *text = read_bytes(p, &len);
    free(p);
    int lines = 0;
    for (size_t i = 0; i < len; i++) lines += text[i] == '\n';
    /* five shards of different kinds, written out of name order; byte
     * order puts "shard-10" before "shard-2" */
    struct { const char *name; int a, b; int kind; } sh[] = {
        {"shard-3.jsonl.zst", 180, 240, 2}, {"shard-10.jsonl", 0, 60, 0},
        {"shard-2.jsonl.gz", 120, 180, 1}, {"shard-1.mtok", 60, 120, 3},
        {"shard-4.jsonl", 240, lines, 0},
    };
    int order[] = {3, 1, 2, 0, 4};  // lines 60.., 0.., 120.., 180.., 240.. in name order
    mt_error err = {{0}};
    for (int i = 0; i < 5; i++) {
        char *part = lines_of(text, sh[i].a, sh[i].b), *sp = mt_path_join(shards, sh[i].name);
        if (sh[i].kind == 0) write_bytes(sp, part, strlen(part));
        if (sh[i].kind == 1) write_gzip(sp, part, strlen(part), 1);
        if (sh[i].kind == 2) write_zstd(sp, part, strlen(part), 1);
        if (sh[i].kind == 3) {  // pre-tokenized, as megatrain tokenize writes it
            char *src = mt_path_join(dir, "part.jsonl");
            write_bytes(src, part, strlen(part));
            mt_dataset *d = open_path(src, tok, &err);
            cr_assert(d, "%s", err.msg);
            cr_assert_eq(mt_mtok_write(sp, mt_dataset_corpus(d), &err), 0, "%s", err.msg);
            mt_dataset_free(d);
            free(src);
        }
        free(part), free(sp);
    }
    /* what a reader must leave alone */
    char *readme = mt_path_join(shards, "README.md"), *hidden = mt_path_join(shards, ".cache.jsonl");
    write_bytes(readme, "# shards\n", 9);
    write_bytes(hidden, "not json\n", 9);
    char *sub = mt_path_join(shards, "old");
    cr_assert_eq(mkdir(sub, 0755), 0);
    /* the concatenation in name order */
    char *cat = malloc(len + 1), *q = cat;
    for (int k = 0; k < 5; k++) {
        char *part = lines_of(text, sh[order[k]].a, sh[order[k]].b);
        q += sprintf(q, "%s", part);
        free(part);
    }
    char *catp = mt_path_join(dir, "cat.jsonl");
    write_bytes(catp, cat, (size_t)(q - cat));
    mt_dataset *a = open_path(catp, tok, &err), *b = open_path(shards, tok, &err);
    cr_assert(a && b, "%s", err.msg);
    mt_data_stats st = mt_dataset_stats(b);
    cr_expect_eq(st.files, 5);
    cr_expect_str_eq(st.format, "mixed");  // text shards and a token shard
    assert_same_data(a, b, "shard directory");
    mt_dataset_free(a), mt_dataset_free(b);
    /* a shard with another compression is an error, not a file left out */
    char *bz = mt_path_join(shards, "shard-5.jsonl.bz2");
    write_bytes(bz, "BZh9", 4);
    expect_open_error(shards, "shard-5.jsonl.bz2", "bzip2");
    remove(bz);
    free(bz), free(readme), free(hidden), free(sub), free(catp), free(cat), free(text);
    free(shards);
    mt_tokenizer_free(tok);
    mt_test_rmtree(dir);
    free(dir);
}

Test(data_sources, an_empty_directory_is_an_error_naming_it) {
    char *dir = mt_test_tmpdir(), *empty = mt_path_join(dir, "empty");
    cr_assert_eq(mkdir(empty, 0755), 0);
    expect_open_error(empty, empty, "no data files in the directory (0 other entries)");
    char *readme = mt_path_join(empty, "README.md");
    write_bytes(readme, "# nothing\n", 10);
    expect_open_error(empty, "(1 other entries)", "NAME.jsonl.gz");
    char *missing = mt_path_join(dir, "nope.jsonl");
    expect_open_error(missing, missing, "cannot open");
    free(readme), free(missing), free(empty);
    mt_test_rmtree(dir);
    free(dir);
}

/* Issue 29: a dangling or looping *.jsonl link in a directory of shards
 * (and a directory named like one) was counted among "N other entries
 * ignored", and the run went on without that data, exit 0. An entry named
 * like data that cannot be read is an error naming it. */
Test(data_sources, an_unreadable_shard_is_an_error_naming_it) {
    char *dir = mt_test_tmpdir(), *shards = mt_path_join(dir, "s");
    cr_assert_eq(mkdir(shards, 0755), 0);
    char *good = mt_path_join(shards, "a.jsonl");
    write_bytes(good, "{\"text\": \"hello\"}\n", 18);
    char *dangling = mt_path_join(shards, "b.jsonl");
    cr_assert_eq(symlink("/nonexistent/b.jsonl", dangling), 0);
    expect_open_error(shards, dangling, "does not exist");
    cr_assert_eq(unlink(dangling), 0);
    char *loop = mt_path_join(shards, "c.jsonl.zst");
    cr_assert_eq(symlink("c.jsonl.zst", loop), 0);
    expect_open_error(shards, loop, "leads back to itself");
    cr_assert_eq(unlink(loop), 0);
    char *subdir = mt_path_join(shards, "d.jsonl");
    cr_assert_eq(mkdir(subdir, 0755), 0);
    expect_open_error(shards, subdir, "a directory");
    cr_assert_eq(rmdir(subdir), 0);
    /* a link to a readable file is data like any other */
    cr_assert_eq(symlink(good, dangling), 0);
    mt_tokenizer *tok = mt_tokenizer_bytes();
    mt_data_opts o = {.path = shards, .seed = 1, .epochs = 1};
    mt_error err;
    mt_dataset *d = mt_dataset_open(&o, tok, 258, &err);
    cr_assert(d, "%s", err.msg);
    cr_assert_eq(mt_dataset_stats(d).documents, 2);
    mt_dataset_free(d);
    mt_tokenizer_free(tok);
    free(good), free(dangling), free(loop), free(subdir), free(shards);
    mt_test_rmtree(dir);
    free(dir);
}

Test(data_sources, shards_of_different_tokenizers_are_an_error) {
    char *dir = mt_test_tmpdir(), *shards = mt_path_join(dir, "s");
    cr_assert_eq(mkdir(shards, 0755), 0);
    mt_tokenizer *tiny = tiny_tokenizer(), *bytes = mt_tokenizer_bytes();
    const char *doc = "{\"text\": \"some words\"}\n";
    char *src = mt_path_join(dir, "d.jsonl");
    write_bytes(src, doc, strlen(doc));
    mt_error err = {{0}};
    const mt_tokenizer *toks[2] = {bytes, tiny};
    for (int i = 0; i < 2; i++) {
        char name[32];
        snprintf(name, sizeof name, "%d.mtok", i);
        char *sp = mt_path_join(shards, name);
        mt_dataset *d = open_path(src, toks[i], &err);
        cr_assert(d, "%s", err.msg);
        cr_assert_eq(mt_mtok_write(sp, mt_dataset_corpus(d), &err), 0, "%s", err.msg);
        mt_dataset_free(d);
        free(sp);
    }
    mt_data_opts o = {.path = shards, .format = "auto", .seed = 1, .epochs = 1};
    cr_assert_null(mt_dataset_open(&o, tiny, 1 << 20, &err));
    cr_expect(strstr(err.msg, "1.mtok") && strstr(err.msg, "same tokenizer"), "%s", err.msg);
    mt_tokenizer_free(tiny), mt_tokenizer_free(bytes);
    free(src), free(shards);
    mt_test_rmtree(dir);
    free(dir);
}
