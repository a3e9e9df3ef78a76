/* Compressed data that expands far beyond its size (issue 29, item 7): a
 * file of a megabyte or two that holds gigabytes of text. Read whole, it
 * aborted on out-of-memory ("internal error ... out of memory", exit 134)
 * under a memory limit; now a line longer than MT_DATA_MAX_LINE is an error
 * naming the file and line, and the memory check of `train` counts what
 * compressed data decompresses to (not its size on disk) before reading it.
 *
 * The files are made here: one gzip member (zstd frame) of 1 MiB of text,
 * written again and again (concatenated members and frames are read one
 * after the other). Each case runs in a child process under an address-space
 * limit (RLIMIT_AS, as `ulimit -v`) of 1 GiB above what the child already
 * holds: the text is 1.5 GiB, so reading it whole cannot succeed there. */
#include <criterion/criterion.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zlib.h>
#include <zstd.h>

#include "data/data_file.h"
#include "data/dataset.h"
#include "train/train_config.h"
#include "train/trainer.h"
#include "testlib.h"

#define MIB ((size_t)1 << 20)
#define COPIES 1536 /* 1.5 GiB of text */

/* n bytes as one gzip member or zstd frame, appended to f. */
static void put_compressed(FILE *f, const char *text, size_t n, int zstd) {
    if (zstd) {
        size_t cap = ZSTD_compressBound(n);
        void *out = malloc(cap);
        size_t got = ZSTD_compress(out, cap, text, n, 19);
        cr_assert(!ZSTD_isError(got));
        fwrite(out, 1, got, f);
        free(out);
        return;
    }
    z_stream z = {0};
    cr_assert_eq(deflateInit2(&z, 9, Z_DEFLATED, 15 + 16, 9, Z_DEFAULT_STRATEGY), Z_OK);
    uLong cap = deflateBound(&z, (uLong)n);
    unsigned char *out = malloc(cap);
    z.next_in = (Bytef *)text, z.avail_in = (uInt)n;
    z.next_out = out, z.avail_out = (uInt)cap;
    cr_assert_eq(deflate(&z, Z_FINISH), Z_STREAM_END);
    fwrite(out, 1, cap - z.avail_out, f);
    deflateEnd(&z);
    free(out);
}

/* A file of `head` (its own member) then COPIES MiB of `fill` repeated. */
static void write_bomb(const char *path, const char *head, const char *fill, int zstd) {
    FILE *f = fopen(path, "w+b");
    cr_assert(f, "%s", path);
    put_compressed(f, head, strlen(head), zstd);
    char *block = malloc(MIB);
    size_t k = strlen(fill);
    for (size_t i = 0; i < MIB; i++) block[i] = fill[i % k];
    long start = ftell(f);
    put_compressed(f, block, MIB, zstd);
    long len = ftell(f) - start;
    char *member = malloc((size_t)len);
    fseek(f, start, SEEK_SET);
    cr_assert_eq(fread(member, 1, (size_t)len, f), (size_t)len);
    fseek(f, 0, SEEK_END);
    for (int i = 1; i < COPIES; i++) fwrite(member, 1, (size_t)len, f);
    cr_assert_eq(fclose(f), 0);
    free(member);
    free(block);
}

/* Address space this process holds now. */
static size_t held_bytes(void) {
    FILE *f = fopen("/proc/self/statm", "r");
    long pages = 0;
    cr_assert(f && fscanf(f, "%ld", &pages) == 1);
    fclose(f);
    return (size_t)pages * (size_t)sysconf(_SC_PAGESIZE);
}

typedef struct child_result {
    int rc;
    char msg[1024];
} child_result;

typedef int (*child_fn)(const char *path, const char *out, mt_error *err);

/* fn(path) in a child limited to 1 GiB more address space; its return and
 * message. A child that died (the abort of an out-of-memory) fails the test. */
static child_result run_limited(child_fn fn, const char *path, const char *out) {
    int fds[2];
    cr_assert_eq(pipe(fds), 0);
    pid_t pid = fork();
    cr_assert(pid >= 0);
    if (pid == 0) {
        struct rlimit lim;
        getrlimit(RLIMIT_AS, &lim);
        lim.rlim_cur = held_bytes() + 1024 * MIB;
        setrlimit(RLIMIT_AS, &lim);
        child_result r = {0};
        mt_error err = {{0}};
        r.rc = fn(path, out, &err);
        snprintf(r.msg, sizeof r.msg, "%s", err.msg);
        _exit(write(fds[1], &r, sizeof r) == sizeof r ? 0 : 1);
    }
    close(fds[1]);
    child_result r;
    ssize_t got = read(fds[0], &r, sizeof r);
    int status;
    waitpid(pid, &status, 0);
    close(fds[0]);
    cr_assert_eq(got, (ssize_t)sizeof r, "the child died (%s %d) instead of refusing %s",
                 WIFSIGNALED(status) ? "signal" : "exit status",
                 WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status), path);
    return r;
}

static int open_dataset(const char *path, const char *out, mt_error *err) {
    (void)out;
    mt_tokenizer *tok = mt_tokenizer_bytes();
    mt_data_opts o = {.path = path, .seed = 1, .epochs = 1};
    mt_dataset *d = mt_dataset_open(&o, tok, 258, err);
    mt_tokenizer_free(tok);
    if (!d) return -1;
    mt_dataset_free(d);
    return 0;
}

static int train(const char *path, const char *out, mt_error *err) {
    char data[600], dir[600];
    snprintf(data, sizeof data, "%s", path);
    snprintf(dir, sizeof dir, "%s", out);
    char *argv[] = {"train", "--data", data, "--out", dir, "--device", "cpu", "--steps", "1",
                    "--tokenizer", "bytes", "--sample-tokens", "0"};
    mt_train_config tc;
    if (mt_train_config_parse_args(&tc, sizeof argv / sizeof *argv, argv, err)) return -2;
    return mt_train(&tc, err);
}

/* One line of 1.5 GiB: the reader stops at MT_DATA_MAX_LINE, naming the
 * file and line 1. */
static void one_huge_line(int zstd) {
    char *dir = mt_test_tmpdir(), path[512];
    snprintf(path, sizeof path, "%s/bomb.jsonl.%s", dir, zstd ? "zst" : "gz");
    write_bomb(path, "{\"text\": \"", "a", zstd);
    child_result r = run_limited(open_dataset, path, NULL);
    char want[600];
    snprintf(want, sizeof want, "%s:1: the line is longer than %zu bytes", path,
             MT_DATA_MAX_LINE);
    cr_assert(r.rc == -1 && strstr(r.msg, want), "rc %d: %s", r.rc, r.msg);
    mt_test_rmtree(dir);
    free(dir);
}

Test(data_bombs, a_gzip_line_that_expands_past_the_bound_is_refused_naming_it,
     .timeout = MT_TEST_LIMIT(120)) {
    one_huge_line(0);
}

Test(data_bombs, a_zstd_line_that_expands_past_the_bound_is_refused_naming_it,
     .timeout = MT_TEST_LIMIT(120)) {
    one_huge_line(1);
}

/* 1.5 GiB of short valid lines: `train` refuses before reading the data,
 * with the numbers, the decompressed data counted. */
static void many_short_lines(int zstd) {
    char *dir = mt_test_tmpdir(), path[512], out[512];
    snprintf(path, sizeof path, "%s/lines.jsonl.%s", dir, zstd ? "zst" : "gz");
    snprintf(out, sizeof out, "%s/run", dir);
    write_bomb(path, "{\"text\": \"a\"}\n", "{\"text\": \"aaaaaaaaaaaaaaaaa\"}\n", zstd);
    child_result r = run_limited(train, path, out);
    cr_assert(r.rc == -1 && strstr(r.msg, "GB of host RAM") && strstr(r.msg, "data more than") &&
              strstr(r.msg, ".mtok"), "rc %d: %s", r.rc, r.msg);
    mt_test_rmtree(dir);
    free(dir);
}

Test(data_bombs, gzip_data_that_expands_past_the_memory_is_refused_before_reading,
     .timeout = MT_TEST_LIMIT(120)) {
    many_short_lines(0);
}

Test(data_bombs, zstd_data_that_expands_past_the_memory_is_refused_before_reading,
     .timeout = MT_TEST_LIMIT(120)) {
    many_short_lines(1);
}

/* The bound is per line: lines of any length up to it are read, and a line
 * past it is named by its number, also in a block of lines. */
Test(data_bombs, the_line_bound_names_the_line) {
    char *dir = mt_test_tmpdir(), path[512];
    snprintf(path, sizeof path, "%s/lines.jsonl.gz", dir);
    const char *text = "short\nlonger line\r\nxx\n0123456789\nlast";
    FILE *f = fopen(path, "wb");
    put_compressed(f, text, strlen(text), 0);
    fclose(f);
    mt_error err;
    const char *buf;
    size_t len;
    mt_line_reader *r = mt_line_reader_open(path, 11, &err);
    cr_assert(r, "%s", err.msg);
    /* whole lines only: the last one, without '\n', once the file has ended */
    cr_assert_eq(mt_line_reader_next(r, 1, &buf, &len, &err), 0, "%s", err.msg);
    cr_assert(len == strlen(text) - 4 && !memcmp(buf, text, len));
    cr_assert_eq(mt_line_reader_lines(r), 4);
    cr_assert_eq(mt_line_reader_next(r, 1000, &buf, &len, &err), 0, "%s", err.msg);
    cr_assert(len == 4 && !memcmp(buf, "last", 4));
    cr_assert_eq(mt_line_reader_lines(r), 5);
    cr_assert_eq(mt_line_reader_next(r, 1000, &buf, &len, &err), 1);
    mt_line_reader_close(r);
    r = mt_line_reader_open(path, 9, &err); /* "0123456789" is 10 */
    cr_assert(r, "%s", err.msg);
    cr_assert_eq(mt_line_reader_next(r, 1000, &buf, &len, &err), -1);
    char want[600];
    snprintf(want, sizeof want, "%s:2: the line is longer than 9 bytes", path);
    cr_assert(strstr(err.msg, want), "%s", err.msg);
    mt_line_reader_close(r);
    /* a long line, then a longer one without its end past the first read:
     * the first is named */
    snprintf(path, sizeof path, "%s/two.jsonl", dir);
    FILE *p = fopen(path, "w");
    for (int i = 0; i < 100; i++) fputc('a', p);
    fputc('\n', p);
    for (int i = 0; i < (3 << 20); i++) fputc('b', p);
    fclose(p);
    r = mt_line_reader_open(path, 50, &err);
    cr_assert(r, "%s", err.msg);
    cr_assert_eq(mt_line_reader_next(r, (size_t)32 << 20, &buf, &len, &err), -1);
    snprintf(want, sizeof want, "%s:1: the line is longer than 50 bytes", path);
    cr_assert(strstr(err.msg, want), "%s", err.msg);
    mt_line_reader_close(r);
    mt_test_rmtree(dir);
    free(dir);
}
