/* .mtok reading (mmap + validation of every header field) and atomic
 * writing. The layout is described in token_file.h and docs/data.md. */
#include "data/token_file.h"

#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "io/file.h"
#include "util/mem.h"

_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, ".mtok is read in place: little-endian hosts");

static uint32_t rd32(const uint8_t *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}
static uint64_t rd64(const uint8_t *p) {
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

/* Byte sizes of the three arrays; false on overflow. */
static bool section_sizes(uint64_t n_docs, uint64_t n_tokens, uint32_t tb, bool mask,
                          size_t *off_b, size_t *tok_b, size_t *mask_b) {
    if (n_docs >= SIZE_MAX || n_tokens >= SIZE_MAX) return false;
    *mask_b = mask ? (size_t)(n_tokens / 8 + (n_tokens % 8 != 0)) : 0;
    return mt_mul_size((size_t)n_docs + 1, 8, off_b) && mt_mul_size((size_t)n_tokens, tb, tok_b);
}

void mt_mtok_alloc(mt_mtok *m, uint64_t vocab_size, uint64_t n_docs, uint64_t n_tokens,
                   bool with_mask) {
    memset(m, 0, sizeof *m);
    m->vocab_size = vocab_size, m->n_docs = n_docs, m->n_tokens = n_tokens;
    m->token_bytes = mt_mtok_token_bytes(vocab_size);
    size_t ob, tb, mb, total;
    MT_ASSERT(section_sizes(n_docs, n_tokens, m->token_bytes, with_mask, &ob, &tb, &mb));
    MT_ASSERT(mt_add_size(ob, tb, &total) && mt_add_size(total, mb, &total));
    uint8_t *p = mt_calloc_or_die(1, total ? total : 1);
    m->owned[0] = p;
    m->offsets = (const uint64_t *)p;
    m->tokens = p + ob;
    m->mask = with_mask ? p + ob + tb : NULL;
}

int mt_mtok_parse(const void *buf, size_t size, const char *name, mt_mtok *m, mt_error *err) {
    const uint8_t *p = buf;
    memset(m, 0, sizeof *m);
    const char *fix = "re-create it with `megatrain tokenize`";
    if (size < 16 || memcmp(p, "MTOK", 4))
        return mt_errorf(err, "%s: not a .mtok file (no \"MTOK\" magic); %s", name, fix);
    uint32_t version = rd32(p + 4), hs = rd32(p + 8), tb = rd32(p + 12);
    if (version != MT_MTOK_VERSION)
        return mt_errorf(err, "%s: .mtok version %u, this megatrain reads version %d; %s", name,
                         version, MT_MTOK_VERSION, fix);
    if (hs < MT_MTOK_HEADER_SIZE || hs % 8 || hs > size)
        return mt_errorf(err, "%s: header size %u is invalid for a file of %zu bytes (truncated?); %s",
                         name, hs, size, fix);
    uint64_t vocab = rd64(p + 16), n_docs = rd64(p + 24), n_tok = rd64(p + 32);
    uint64_t flags = rd64(p + 40), n_train = rd64(p + 48);
    if (vocab == 0 || vocab > (uint64_t)INT32_MAX)
        return mt_errorf(err, "%s: vocab_size %llu is out of range; %s", name,
                         (unsigned long long)vocab, fix);
    if (tb != mt_mtok_token_bytes(vocab))
        return mt_errorf(err, "%s: token_bytes %u does not match vocab_size %llu (expected %u); %s",
                         name, tb, (unsigned long long)vocab, mt_mtok_token_bytes(vocab), fix);
    if (flags & ~(uint64_t)MT_MTOK_FLAG_MASK)
        return mt_errorf(err, "%s: unknown flags 0x%llx; %s", name, (unsigned long long)flags, fix);
    if (n_docs == 0) return mt_errorf(err, "%s: the file holds no documents; %s", name, fix);
    bool has_mask = flags & MT_MTOK_FLAG_MASK;
    size_t ob, tokb, mb, want = hs;
    if (!section_sizes(n_docs, n_tok, tb, has_mask, &ob, &tokb, &mb) || !mt_add_size(want, ob, &want) ||
        !mt_add_size(want, tokb, &want) || !mt_add_size(want, mb, &want) || want != size)
        return mt_errorf(err,
                         "%s: size %zu bytes does not match its header (%llu documents, %llu "
                         "tokens of %u bytes%s): truncated or corrupt; %s",
                         name, size, (unsigned long long)n_docs, (unsigned long long)n_tok, tb,
                         has_mask ? ", loss mask" : "", fix);
    m->vocab_size = vocab, m->n_docs = n_docs, m->n_tokens = n_tok, m->n_trainable = n_train;
    m->token_bytes = tb;
    m->offsets = (const uint64_t *)(p + hs);
    m->tokens = p + hs + ob;
    m->mask = has_mask ? p + hs + ob + tokb : NULL;
    if (m->offsets[0] != 0 || m->offsets[n_docs] != n_tok)
        return mt_errorf(err, "%s: document offsets must run from 0 to n_tokens %llu: corrupt; %s",
                         name, (unsigned long long)n_tok, fix);
    for (uint64_t d = 0; d < n_docs; d++)
        if (m->offsets[d + 1] < m->offsets[d])
            return mt_errorf(err, "%s: document %llu has a negative length: corrupt; %s", name,
                             (unsigned long long)d, fix);
    uint64_t count = 0;
    for (uint64_t i = 0; i < n_tok; i++) {
        uint32_t t = mt_mtok_token(m, i);
        if (t >= vocab)
            return mt_errorf(err, "%s: token %llu has id %u >= vocab_size %llu: corrupt; %s", name,
                             (unsigned long long)i, t, (unsigned long long)vocab, fix);
        count += mt_mtok_trainable(m, i);
    }
    if (count != n_train)
        return mt_errorf(err, "%s: header says %llu trainable tokens, the mask has %llu: corrupt; %s",
                         name, (unsigned long long)n_train, (unsigned long long)count, fix);
    return 0;
}

int mt_mtok_open(const char *path, mt_mtok *m, mt_error *err) {
    memset(m, 0, sizeof *m);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return mt_errorf(err, "%s: cannot open: %m", path);
    struct stat st;
    if (fstat(fd, &st) != 0) {
        close(fd);
        return mt_errorf(err, "%s: cannot stat: %m", path);
    }
    size_t size = (size_t)st.st_size;
    void *map = size ? mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0) : MAP_FAILED;
    close(fd);
    if (size == 0) return mt_errorf(err, "%s: the file is empty; re-create it with `megatrain tokenize`", path);
    if (map == MAP_FAILED) return mt_errorf(err, "%s: cannot map: %m", path);
    if (mt_mtok_parse(map, size, path, m, err)) {
        munmap(map, size);
        return -1;
    }
    m->map = map, m->map_len = size;
    return 0;
}

int mt_mtok_write(const char *path, const mt_mtok *m, mt_error *err) {
    uint8_t h[MT_MTOK_HEADER_SIZE] = {0};
    uint32_t v32[3] = {MT_MTOK_VERSION, MT_MTOK_HEADER_SIZE, m->token_bytes};
    uint64_t v64[6] = {m->vocab_size, m->n_docs, m->n_tokens, m->mask ? MT_MTOK_FLAG_MASK : 0,
                       m->n_trainable, 0};
    memcpy(h, "MTOK", 4);
    memcpy(h + 4, v32, sizeof v32);
    memcpy(h + 16, v64, sizeof v64);
    size_t ob, tb, mb;
    MT_ASSERT(section_sizes(m->n_docs, m->n_tokens, m->token_bytes, m->mask, &ob, &tb, &mb));
    mt_atomic_file f;
    if (mt_atomic_open(&f, path, err)) return -1;
    if (mt_write_all(f.fd, h, sizeof h, path, err) || mt_write_all(f.fd, m->offsets, ob, path, err) ||
        mt_write_all(f.fd, m->tokens, tb, path, err) ||
        (m->mask && mt_write_all(f.fd, m->mask, mb, path, err))) {
        mt_atomic_abort(&f);
        return -1;
    }
    return mt_atomic_commit(&f, err);
}

void mt_mtok_free(mt_mtok *m) {
    if (m->map) munmap(m->map, m->map_len);
    for (int i = 0; i < 3; i++) free(m->owned[i]);
    memset(m, 0, sizeof *m);
}
