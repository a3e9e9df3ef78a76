/* Document-masked packing on the CPU: the data side (every token kept once,
 * positions restarting at each document, loss masks unchanged) and the
 * model side (the CPU reference against transformers run with
 * per-document position_ids, fixture from scripts/make_packed_fixture.py). */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/backend_cpu.h"
#include "data/dataset.h"
#include "engine/step.h"
#include "fixture.h"
#include "io/file.h"
#include "testlib.h"

/* ---- data ---- */

#define BOS 256 /* the byte tokenizer's BOS and EOS */
#define EOS 257

/* n documents of 1 to 40 bytes, so that rows of T = 16 hold several
 * documents and cut others. */
static char *write_docs(const char *dir, const char *format, int n) {
    char *s = malloc((size_t)n * 128), *q = s;
    for (int i = 0; i < n; i++) {
        int len = 1 + (i * 7) % 40;
        if (!strcmp(format, "text"))
            q += sprintf(q, "{\"text\": \"%.*s\"}\n", len, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMN");
        else
            q += sprintf(q, "{\"prompt\": \"%.*s\", \"completion\": \"%.*s\"}\n", len % 9 + 1,
                         "QRSTUVWXYZ", len, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMN");
    }
    char *p = mt_path_join(dir, "docs.jsonl");
    FILE *f = fopen(p, "wb");
    cr_assert(f);
    fwrite(s, 1, strlen(s), f);
    fclose(f);
    free(s);
    return p;
}

static mt_dataset *open_packed(const char *path, const char *packing, const mt_tokenizer *tok) {
    mt_data_opts o = {.path = path, .packing = packing, .seed = 3, .epochs = 2};
    mt_error err = {{0}};
    mt_dataset *d = mt_dataset_open(&o, tok, 258, &err);
    cr_assert(d, "%s", err.msg);
    return d;
}

/* Reads both epochs from a "rows" and a "documents" dataset of the same
 * file: tokens must be equal (so every token is kept exactly once, as
 * packing_keeps_every_token_once_per_epoch shows for rows), positions must
 * restart exactly where a document starts (at BOS, which the byte tokenizer
 * gives no other token) and at each row's start, and targets must be those
 * of rows except a document's first token, which nothing predicts. */
static void check_documents_vs_rows(const char *format, int expect_same_targets) {
    char *dir = mt_test_tmpdir(), *p = write_docs(dir, format, 60);
    mt_tokenizer *tok = mt_tokenizer_bytes();
    mt_dataset *rows = open_packed(p, "rows", tok), *docs = open_packed(p, "documents", tok);
    cr_assert(!mt_dataset_packs_documents(rows) && mt_dataset_packs_documents(docs));
    enum { B = 3, T = 16 };
    int32_t xr[B * T], yr[B * T], xd[B * T], yd[B * T], pos[B * T];
    int batches = 0, restarts = 0, dropped = 0;
    while (!mt_dataset_next_batch(rows, B, T, xr, yr, NULL)) {
        cr_assert_eq(mt_dataset_next_batch(docs, B, T, xd, yd, pos), 0, "batch %d", batches);
        cr_assert(!memcmp(xr, xd, sizeof xr), "batch %d: tokens differ", batches);
        for (int i = 0; i < B * T; i++) {
            int t = i % T;
            int32_t want = t == 0 || xd[i] == BOS ? 0 : pos[i - 1] + 1;
            cr_assert_eq(pos[i], want, "batch %d token %d: position %d, want %d", batches, i,
                         pos[i], want);
            restarts += t > 0 && pos[i] == 0;
            if (yr[i] == BOS) {  // the next document's first token: not predicted
                cr_assert_eq(yd[i], -100, "batch %d token %d", batches, i);
                dropped++;
            } else {
                cr_assert_eq(yd[i], yr[i], "batch %d token %d: target %d, rows %d", batches, i,
                             yd[i], yr[i]);
            }
        }
        batches++;
    }
    cr_assert_eq(mt_dataset_next_batch(docs, B, T, xd, yd, pos), 1, "same end of data");
    cr_assert_gt(batches, 10);
    cr_assert_gt(restarts, batches, "rows hold several documents");
    /* completion: BOS never has loss, so no target changes; text: BOS has. */
    if (expect_same_targets) cr_assert_eq(dropped, 0);
    else cr_assert_gt(dropped, 0);
    mt_dataset_free(rows), mt_dataset_free(docs);
    mt_tokenizer_free(tok);
    free(p);
    mt_test_rmtree(dir);
    free(dir);
}

Test(packing, completion_documents_keep_tokens_and_loss_masks) {
    check_documents_vs_rows("completion", 1);
}

Test(packing, text_documents_drop_only_cross_document_targets) {
    check_documents_vs_rows("text", 0);
}

/* auto: documents for SFT formats, rows for plain text; a bad name is refused. */
Test(packing, auto_choice_and_errors) {
    char *dir = mt_test_tmpdir();
    mt_tokenizer *tok = mt_tokenizer_bytes();
    const char *fmts[] = {"completion", "text"}, *want[] = {"documents", "rows"};
    for (int i = 0; i < 2; i++) {
        char *p = write_docs(dir, fmts[i], 5);
        mt_dataset *d = open_packed(p, "auto", tok);
        cr_expect(!strcmp(mt_dataset_stats(d).packing, want[i]), "%s: %s", fmts[i],
                  mt_dataset_stats(d).packing);
        mt_dataset_free(d);
        d = open_packed(p, NULL, tok);
        cr_expect(!strcmp(mt_dataset_stats(d).packing, want[i]), "NULL is auto");
        mt_dataset_free(d);
        free(p);
    }
    char *p = write_docs(dir, "text", 5);
    mt_data_opts o = {.path = p, .packing = "document", .epochs = 1};
    mt_error err = {{0}};
    cr_assert_null(mt_dataset_open(&o, tok, 258, &err));
    cr_expect(strstr(err.msg, "'document'") && strstr(err.msg, "documents or rows"), "%s", err.msg);
    free(p);
    mt_tokenizer_free(tok);
    mt_test_rmtree(dir);
    free(dir);
}

/* A resumed dataset gives the same positions as the one that ran on. */
Test(packing, resume_reproduces_positions) {
    char *dir = mt_test_tmpdir(), *p = write_docs(dir, "completion", 40);
    mt_tokenizer *tok = mt_tokenizer_bytes();
    mt_dataset *a = open_packed(p, "documents", tok), *b = open_packed(p, "documents", tok);
    enum { B = 2, T = 16 };
    int32_t x[B * T], y[B * T], pa[B * T], xb[B * T], yb[B * T], pb[B * T];
    for (int i = 0; i < 5; i++) cr_assert_eq(mt_dataset_next_batch(a, B, T, x, y, pa), 0);
    mt_dataset_set_pos(b, mt_dataset_get_pos(a));
    for (int i = 0; i < 5; i++) {
        cr_assert_eq(mt_dataset_next_batch(a, B, T, x, y, pa), 0);
        cr_assert_eq(mt_dataset_next_batch(b, B, T, xb, yb, pb), 0);
        cr_assert(!memcmp(pa, pb, sizeof pa) && !memcmp(y, yb, sizeof y), "batch %d", i);
    }
    mt_dataset_free(a), mt_dataset_free(b);
    mt_tokenizer_free(tok);
    free(p);
    mt_test_rmtree(dir);
    free(dir);
}

/* ---- model ---- */

/* Tolerances. fp32 on both sides: differences come from summation order
 * only; test_model_hf.c observes < 3e-6 on logits and loss and < 2e-5 on
 * gradients for the same models unpacked, and packing adds no operation
 * (it removes terms from the softmax sums). Logits: 1e-5 as required of
 * packing; loss 3e-6 and gradients 2e-4 as in test_model_hf.c. A key of a
 * wrong document changes logits by ~4 (the script asserts > 1e-2). */
#define TOL_LOGITS 1e-5
#define TOL_LOSS 3e-6
#define TOL_GRAD 2e-4

static void check_packed_hf(const char *model) {
    mt_fixture f;
    mt_fixture_open(&f, model);
    mt_fixture_use_ref(&f, "packed.safetensors");
    mt_error err;
    size_t N = (size_t)(f.B * f.T);
    int32_t *tok = mt_fixture_i32(&f, "input_ids", 0, N);
    int32_t *tgt = mt_fixture_i32(&f, "targets", 0, N);
    int32_t *pos = mt_fixture_i32(&f, "position_ids", 0, N);
    float *ref_loss = mt_fixture_f32(&f, "loss", NULL);
    /* One micro-batch of B rows, and B micro-batches of one row. */
    for (int split = 0; split < 2; split++) {
        int M = split ? (int)f.B : 1;
        int64_t B = split ? 1 : f.B;
        mt_backend *be = mt_cpu_backend_create(&f.cfg, &f.table, &f.store, M, B, f.T, &err);
        cr_assert_not_null(be, "%s", err.msg);
        mt_batch b = {.M = M, .B = B, .T = f.T, .tokens = tok, .targets = tgt, .pos = pos};
        double loss;
        cr_assert_eq(mt_step_forward_backward(be, f.table.n_layers, &b, &loss, &err), 0, "%s",
                     err.msg);
        cr_assert_lt(fabs(loss - ref_loss[0]) / ref_loss[0], TOL_LOSS,
                     "%s (M=%d): loss %.8f vs HF %.8f", model, M, loss, ref_loss[0]);
        double g = mt_fixture_compare(&f, f.store.g, "grad.", TOL_GRAD, "packed gradient", 0);
        cr_log_info("%s M=%d: loss rel err %.2g, worst gradient rel err %.2g", model, M,
                    fabs(loss - ref_loss[0]) / ref_loss[0], g);
        if (!split) {
            double sum;
            int64_t nv;
            cr_assert_eq(mt_step_eval(be, f.table.n_layers, &b, &sum, &nv, &err), 0, "%s", err.msg);
            size_t nl;
            float *ref = mt_fixture_f32(&f, "logits", &nl);
            cr_assert_eq(nl, N * (size_t)f.cfg.V);
            float *ours = malloc(nl * sizeof *ours);
            for (size_t r = 0; r < N; r++) mt_cpu_backend_logits(be, 0, (int64_t)r, ours + r * f.cfg.V);
            double e = mt_test_rel_err(ours, ref, nl);
            cr_log_info("%s: packed logits rel err %.2g", model, e);
            cr_assert_leq(e, TOL_LOGITS, "%s: packed logits rel err %.3g", model, e);
            free(ours);
            free(ref);
        }
        mt_cpu_backend_free(be);
    }
    free(ref_loss);
    free(tok);
    free(tgt);
    free(pos);
    mt_fixture_close(&f);
}

Test(packing, llama_matches_hf_position_ids) { check_packed_hf("llama_gqa"); }
Test(packing, qwen2_matches_hf_position_ids) { check_packed_hf("qwen2_bias_tied"); }
/* gemma3_text: documents of 7 and 11 tokens under a sliding layer of 6 keys
 * (the window inside the document) and two rope tables with the positions */
Test(packing, gemma3_text_matches_hf_position_ids) { check_packed_hf("gemma3_text_sliding"); }

/* Positions 0..T-1 in every row describe one sequence per row: the same
 * numbers, bit for bit, as no positions. */
Test(packing, one_document_per_row_equals_no_positions) {
    mt_fixture f;
    mt_fixture_open(&f, "llama_gqa");
    mt_error err;
    size_t N = (size_t)(f.B * f.T);
    int32_t *tok = mt_fixture_i32(&f, "input_ids", 0, N);
    int32_t *tgt = mt_fixture_i32(&f, "targets", 0, N);
    int32_t *pos = malloc(N * sizeof *pos);
    for (size_t i = 0; i < N; i++) pos[i] = (int32_t)(i % (size_t)f.T);
    mt_backend *be = mt_cpu_backend_create(&f.cfg, &f.table, &f.store, 1, f.B, f.T, &err);
    cr_assert_not_null(be, "%s", err.msg);
    double loss[2];
    float *g0 = malloc(f.table.total * sizeof *g0);
    for (int i = 0; i < 2; i++) {
        mt_batch b = {.M = 1, .B = f.B, .T = f.T, .tokens = tok, .targets = tgt,
                      .pos = i ? pos : NULL};
        cr_assert_eq(mt_step_forward_backward(be, f.table.n_layers, &b, &loss[i], &err), 0);
        if (!i) memcpy(g0, f.store.g, f.table.total * sizeof *g0);
    }
    cr_assert_eq(loss[0], loss[1]);
    cr_assert(!memcmp(g0, f.store.g, f.table.total * sizeof *g0), "gradients differ");
    mt_cpu_backend_free(be);
    free(g0), free(tok), free(tgt), free(pos);
    mt_fixture_close(&f);
}

/* Positions breaking the contract of mt_batch are refused before any work. */
Test(packing, bad_positions_are_refused) {
    int32_t tok[8] = {0}, tgt[8] = {1, 1, 1, 1, 1, 1, 1, 1};
    int32_t bad[][8] = {{1, 2, 3, 4, 0, 1, 2, 3},   /* row 0 starts at 1 */
                        {0, 1, 3, 4, 0, 1, 2, 3},   /* jumps by 2 */
                        {0, 1, 2, 3, 1, 2, 3, 4}};  /* row 1 continues row 0 */
    const char *want[] = {"position 1 at token 0 of batch row 0",
                          "position 3 at token 2 of batch row 0",
                          "position 1 at token 0 of batch row 1"};
    for (int i = 0; i < 3; i++) {
        mt_batch b = {.M = 1, .B = 2, .T = 4, .tokens = tok, .targets = tgt, .pos = bad[i]};
        mt_error err = {{0}};
        cr_assert_eq(mt_batch_check_pos(&b, &err), -1, "case %d accepted", i);
        cr_expect(strstr(err.msg, want[i]), "case %d: %s", i, err.msg);
    }
}
