/* The chat template of a saved model's tokenizer_config.json: set in place,
 * leaving every other byte of the file as it was (a reformatting JSON
 * writer would turn model_max_length's 1000000000000000019884624838656
 * into 1e+30, which transformers then reads as a float). */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "io/file.h"
#include "io/model_io.h"
#include "util/mem.h"

static size_t skip_ws(const char *s, size_t n, size_t i) {
    while (i < n && strchr(" \t\r\n", s[i]) && s[i]) i++;
    return i;
}

/* The end of the JSON string starting at s[i] (its opening quote). */
static size_t skip_string(const char *s, size_t n, size_t i) {
    for (i++; i < n && s[i] != '"'; i++)
        if (s[i] == '\\') i++;
    return i + 1;
}

/* The end of the JSON value starting at s[i] (valid JSON: cJSON read it). */
static size_t skip_value(const char *s, size_t n, size_t i) {
    if (s[i] == '"') return skip_string(s, n, i);
    if (s[i] != '{' && s[i] != '[') {
        while (i < n && !strchr(",}] \t\r\n", s[i])) i++;
        return i;
    }
    int depth = 0;
    for (; i < n; i++) {
        if (s[i] == '"') i = skip_string(s, n, i) - 1;
        else if (s[i] == '{' || s[i] == '[') depth++;
        else if ((s[i] == '}' || s[i] == ']') && --depth == 0) return i + 1;
    }
    return n;
}

/* The byte range of the top-level key's value in the object text s, or false. */
static bool find_key(const char *s, size_t n, const char *key, size_t *a, size_t *b) {
    size_t i = skip_ws(s, n, 0) + 1, klen = strlen(key);
    for (;;) {
        i = skip_ws(s, n, i);
        if (i >= n || s[i] != '"') return false;
        size_t k = i + 1, ke = skip_string(s, n, i);
        i = skip_ws(s, n, ke) + 1;  // past ':'
        i = skip_ws(s, n, i);
        size_t ve = skip_value(s, n, i);
        if (ke - 1 - k == klen && !memcmp(s + k, key, klen)) return *a = i, *b = ve, true;
        i = skip_ws(s, n, ve);
        if (i >= n || s[i] != ',') return false;
        i++;
    }
}

static int write_text(const char *path, const char *a, size_t na, const char *b, size_t nb,
                      const char *c, size_t nc, mt_error *err) {
    mt_atomic_file f;
    if (mt_atomic_open(&f, path, err)) return -1;
    if (mt_write_all(f.fd, a, na, path, err) || mt_write_all(f.fd, b, nb, path, err) ||
        mt_write_all(f.fd, c, nc, path, err)) {
        mt_atomic_abort(&f);
        return -1;
    }
    return mt_atomic_commit(&f, err);
}

int mt_model_set_chat_template(const char *dir, const char *jinja, mt_error *err) {
    char *path = mt_path_join(dir, "tokenizer_config.json"), *text = NULL;
    char *jpath = mt_path_join(dir, "chat_template.jinja");
    cJSON *s = cJSON_CreateString(jinja);
    char *value = cJSON_PrintUnformatted(s);  // the template as a JSON string
    size_t len = 0, a, b;
    int rc = -1;
    cJSON *cfg = NULL;
    if (mt_file_exists(path)) {
        if (mt_read_file(path, &text, &len, err)) goto out;
        cfg = cJSON_ParseWithLength(text, len);
        if (!cJSON_IsObject(cfg)) {
            mt_errorf(err, "%s: not a JSON object; cannot record the chat template in it", path);
            goto out;
        }
    }
    if (!text) {
        rc = write_text(path, "{\n  \"chat_template\": ", 21, value, strlen(value), "\n}\n", 3, err);
    } else if (find_key(text, len, "chat_template", &a, &b)) {
        rc = write_text(path, text, a, value, strlen(value), text + b, len - b, err);
    } else {  // a new first key
        size_t open = skip_ws(text, len, 0) + 1;
        bool empty = text[skip_ws(text, len, open)] == '}';
        char *head = mt_malloc_or_die(open + 32);
        memcpy(head, text, open);
        int hn = (int)open + snprintf(head + open, 32, "\n  \"chat_template\": ");
        const char *tail = text + open;
        char *rest = mt_malloc_or_die(len - open + 2);
        snprintf(rest, len - open + 2, "%s%.*s", empty ? "" : ",", (int)(len - open), tail);
        rc = write_text(path, head, (size_t)hn, value, strlen(value), rest, strlen(rest), err);
        free(head), free(rest);
    }
    // chat_template.jinja would take priority over the config's template.
    if (rc == 0 && mt_file_exists(jpath) && unlink(jpath))
        rc = mt_errorf(err, "%s: cannot remove it (it would override the chat template)", jpath);
out:
    cJSON_Delete(cfg);
    cJSON_Delete(s);
    free(value), free(text), free(path), free(jpath);
    return rc;
}
