/* What an option table drives (options.h): defaults, values from text,
 * flags, suggestions for unknown names, and the --help text. */
#include "util/options.h"

#include <ctype.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "util/args.h"

/* Names and values ------------------------------------------------------- */

/* key with '-' read as '_', lower case, into buf; false when too long. */
static bool normalize_key(const char *key, char *buf, size_t n) {
    size_t i = 0;
    for (; key[i]; i++) {
        if (i + 1 >= n) return false;
        buf[i] = key[i] == '-' ? '_' : (char)tolower((unsigned char)key[i]);
    }
    buf[i] = 0;
    return true;
}

/* name with '_' written as '-', the flag's spelling. */
static void flag_of(const char *name, char *buf, size_t n) {
    size_t i = 0;
    for (; name[i] && i + 1 < n; i++) buf[i] = name[i] == '_' ? '-' : name[i];
    buf[i] = 0;
}

const mt_opt *mt_opt_find(const mt_opt_table *t, const char *key) {
    char k[64];
    if (!normalize_key(key, k, sizeof k)) return NULL;
    for (size_t i = 0; i < t->n; i++)
        if (!strcmp(k, t->opts[i].name)) return &t->opts[i];
    return NULL;
}

/* The alias of that kind spelt `key`, or NULL. */
static const mt_opt_alias *find_alias(const mt_opt_table *t, const char *key,
                                      mt_opt_alias_kind kind) {
    char k[64];
    if (kind == MT_ALIAS_SHORT) snprintf(k, sizeof k, "%s", key);
    else if (!normalize_key(key, k, sizeof k)) return NULL;
    for (size_t i = 0; i < t->n_aliases; i++)
        if (t->aliases[i].kind == kind && !strcmp(k, t->aliases[i].spelling))
            return &t->aliases[i];
    return NULL;
}

const mt_opt *mt_opt_lookup(const mt_opt_table *t, const char *key) {
    const mt_opt *o = mt_opt_find(t, key);
    const mt_opt_alias *a = o ? NULL : find_alias(t, key, MT_ALIAS_DEPRECATED);
    return a ? mt_opt_find(t, a->name) : o;
}

static size_t edit_distance(const char *a, const char *b) {
    size_t la = strlen(a), lb = strlen(b), row[64];
    if (lb >= 64) return (size_t)-1;
    for (size_t j = 0; j <= lb; j++) row[j] = j;
    for (size_t i = 1; i <= la; i++) {
        size_t diag = row[0];
        row[0] = i;
        for (size_t j = 1; j <= lb; j++) {
            size_t up = row[j], best = diag + (a[i - 1] != b[j - 1]);
            if (up + 1 < best) best = up + 1;
            if (row[j - 1] + 1 < best) best = row[j - 1] + 1;
            diag = up;
            row[j] = best;
        }
    }
    return row[lb];
}

const char *mt_opt_suggest(const mt_opt_table *t, const char *key) {
    char k[64];
    if (!normalize_key(key, k, sizeof k)) return NULL;
    const mt_opt_alias *a = find_alias(t, k, MT_ALIAS_SUGGEST);
    if (a) return a->name;
    /* The start of one name only, as getopt took it ("--temp"). */
    const char *prefixed = NULL;
    for (size_t i = 0; i < t->n && strlen(k) >= 3; i++)
        if (!strncmp(t->opts[i].name, k, strlen(k))) prefixed = prefixed ? "" : t->opts[i].name;
    if (prefixed && *prefixed) return prefixed;
    const char *best = NULL;
    size_t best_d = (size_t)-1;
    for (size_t i = 0; i < t->n; i++) {
        size_t d = edit_distance(k, t->opts[i].name);
        if (d < best_d) best_d = d, best = t->opts[i].name;
    }
    /* Typos: a couple of edits, or a third of a long name. */
    size_t limit = strlen(k) / 3 > 2 ? strlen(k) / 3 : 2;
    return best_d <= limit ? best : NULL;
}

static void *field(void *obj, const mt_opt *o) { return (char *)obj + o->offset; }
static const void *cfield(const void *obj, const mt_opt *o) {
    return (const char *)obj + o->offset;
}
static bool *given_of(const mt_opt_table *t, void *obj) { return (bool *)((char *)obj + t->given); }

/* The choices of an enum option joined by sep ("a, b" or "a|b"). */
static void join_choices(const mt_opt *o, const char *sep, char *buf, size_t n) {
    size_t used = 0;
    buf[0] = 0;
    for (int i = 0; o->choices[i] && used < n; i++)
        used += (size_t)snprintf(buf + used, n - used, "%s%s", i ? sep : "", o->choices[i]);
}

int mt_opt_check_range(const mt_opt *o, double v, const char *text, const char *label,
                       mt_error *err) {
    const mt_opt_range *r = &o->range;
    bool low = !isnan(r->lo) && (r->lo_open ? v <= r->lo : v < r->lo);
    bool high = !isnan(r->hi) && (r->hi_open ? v >= r->hi : v > r->hi);
    if (!low && !high) return 0;
    if (!isnan(r->lo) && !isnan(r->hi) && r->hi != MT_OPT_INT_MAX)
        return mt_errorf(err, "%s: must be %s %g and %s %g, got %s", label,
                         r->lo_open ? ">" : ">=", r->lo, r->hi_open ? "<" : "<=", r->hi, text);
    if (high)
        return mt_errorf(err, "%s: must be at most %.0f, got %s", label, r->hi, text);
    return mt_errorf(err, "%s: must be %s %g, got %s", label, r->lo_open ? ">" : ">=", r->lo,
                     text);
}

static int parse_bool(const char *s, bool *out) {
    static const char *const yes[] = {"true", "yes", "on", "1"},
                             *const no[] = {"false", "no", "off", "0"};
    for (int i = 0; i < 4; i++) {
        if (!strcasecmp(s, yes[i])) return *out = true, 0;
        if (!strcasecmp(s, no[i])) return *out = false, 0;
    }
    return -1;
}

/* Integers may be written 1000 or 1e3, not 2.5 or 0x10; as a double, which
 * the range check reads, and exactly: past 2^53 (the largest a JSON number
 * keeps) *out is a value past it that the range check refuses, never a
 * neighbour rounded back in. */
static int parse_int(const char *s, double *out) {
    int bad = 0;
    long long i = mt_arg_ll(s, &bad);
    double v = (double)i, most = MT_OPT_INT_MAX;
    if (!bad && (i > (long long)most || i < -(long long)most)) v = copysign(2 * most, v);
    if (bad) { /* 1e3, or digits past long long */
        bad = 0;
        v = mt_arg_d(s, &bad);
        if (bad || v != floor(v)) return -1;
        if (fabs(v) >= most) v = copysign(2 * most, v);
    }
    *out = v;
    return 0;
}

static int set_number(void *obj, const mt_opt *o, const char *value, const char *label,
                      mt_error *err) {
    double v;
    int bad = 0;
    if (o->type == MT_OPT_INT && parse_int(value, &v))
        return mt_errorf(err, "%s: expected an integer (decimal, like 1000 or 1e3), got '%s'",
                         label, value);
    if (o->type == MT_OPT_FLOAT && (v = mt_arg_d(value, &bad), bad))
        return mt_errorf(err, "%s: expected a number (decimal, like 1e-5 or 0.1), got '%s'",
                         label, value);
    if (mt_opt_check_range(o, v, value, label, err)) return -1;
    if (o->type == MT_OPT_INT) *(int64_t *)field(obj, o) = (int64_t)v;
    else *(double *)field(obj, o) = v;
    return 0;
}

static int set_enum(void *obj, const mt_opt *o, const char *value, const char *label,
                    mt_error *err) {
    int i = 0;
    while (o->choices[i] && strcasecmp(o->choices[i], value)) i++;
    if (!o->choices[i]) {
        char list[256];
        join_choices(o, ", ", list, sizeof list);
        return mt_errorf(err, "%s: unknown value '%s' (allowed: %s)", label, value, list);
    }
    *(int *)field(obj, o) = i;
    return 0;
}

int mt_opt_set(const mt_opt_table *t, void *obj, const mt_opt *o, const char *value,
               const char *label, mt_error *err) {
    switch (o->type) {
    case MT_OPT_STRING:
        if (strlen(value) >= MT_OPT_STR)
            return mt_errorf(err, "%s: value is longer than %d bytes", label, MT_OPT_STR - 1);
        strcpy(field(obj, o), value);
        break;
    case MT_OPT_TEXT: *(const char **)field(obj, o) = value; break;
    case MT_OPT_INT:
    case MT_OPT_FLOAT:
        if (set_number(obj, o, value, label, err)) return -1;
        break;
    case MT_OPT_BOOL:
        if (parse_bool(value, field(obj, o)))
            return mt_errorf(err, "%s: expected true or false, got '%s'", label, value);
        break;
    case MT_OPT_ENUM:
        if (set_enum(obj, o, value, label, err)) return -1;
        break;
    }
    given_of(t, obj)[o - t->opts] = true;
    return 0;
}

bool mt_opt_given(const mt_opt_table *t, const void *obj, const char *name) {
    const mt_opt *o = mt_opt_find(t, name);
    MT_ASSERT(o);
    return given_of(t, (void *)obj)[o - t->opts];
}

/* Shortest text that reads back to exactly v, with a '.' so that YAML
 * readers of other tools see a float ("1.0e-05", "0.0"). */
static void format_double(double v, char *buf, size_t n) {
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(buf, n, "%.*g", prec, v);
        if (strtod(buf, NULL) == v) break;
    }
    if (strchr(buf, '.') || strchr(buf, 'n') || strchr(buf, 'i')) return;
    char *e = strchr(buf, 'e');
    char tail[32];
    snprintf(tail, sizeof tail, "%s", e ? e : "");
    if (e) *e = 0;
    size_t len = strlen(buf);
    snprintf(buf + len, n - len, ".0%s", tail);
}

void mt_opt_format(const void *obj, const mt_opt *o, char *buf, size_t n) {
    const void *p = cfield(obj, o);
    switch (o->type) {
    case MT_OPT_STRING: snprintf(buf, n, "%s", (const char *)p); break;
    case MT_OPT_TEXT: {
        const char *text = *(const char *const *)p;
        snprintf(buf, n, "%s", text ? text : "");
        break;
    }
    case MT_OPT_INT: snprintf(buf, n, "%lld", (long long)*(const int64_t *)p); break;
    case MT_OPT_FLOAT: format_double(*(const double *)p, buf, n); break;
    case MT_OPT_BOOL: snprintf(buf, n, "%s", *(const bool *)p ? "true" : "false"); break;
    case MT_OPT_ENUM: snprintf(buf, n, "%s", o->choices[*(const int *)p]); break;
    }
}

/* The field of o at zero: "", NULL, 0, false, the first choice. */
static void clear_field(void *obj, const mt_opt *o) {
    void *p = field(obj, o);
    switch (o->type) {
    case MT_OPT_STRING: *(char *)p = 0; break;
    case MT_OPT_TEXT: *(const char **)p = NULL; break;
    case MT_OPT_INT: *(int64_t *)p = 0; break;
    case MT_OPT_FLOAT: *(double *)p = 0; break;
    case MT_OPT_BOOL: *(bool *)p = false; break;
    case MT_OPT_ENUM: *(int *)p = 0; break;
    }
}

void mt_opt_defaults(const mt_opt_table *t, void *obj) {
    MT_ASSERT(t->n <= t->n_given);
    for (size_t i = 0; i < t->n; i++) {
        const mt_opt *o = &t->opts[i];
        mt_error err;
        clear_field(obj, o);
        if (!o->def || (!o->def[0] && o->type != MT_OPT_STRING)) continue;
        if (mt_opt_set(t, obj, o, o->def, o->name, &err))
            MT_DIE("bad default in the option table of %s: %s", t->command, err.msg);
    }
    memset(given_of(t, obj), 0, t->n_given * sizeof(bool));
}

/* Flags ------------------------------------------------------------------- */

static int unknown_flag(const mt_opt_table *t, const char *dashes, const char *name,
                        mt_error *err) {
    const char *s = *dashes == '-' && dashes[1] == '-' ? mt_opt_suggest(t, name) : NULL;
    char flag[96];
    if (s) {
        flag_of(s, flag, sizeof flag);
        return mt_errorf(err, "unknown option '%s%s' (did you mean '--%s'?)", dashes, name, flag);
    }
    return mt_errorf(err, "unknown option '%s%s' (run 'megatrain %s --help' for the list)",
                     dashes, name, t->command);
}

/* The option a flag name stands for: itself, or an older spelling (which
 * is noted). */
static const mt_opt *flag_option(const mt_opt_table *t, const char *name, mt_opt_note_fn note,
                                 void *user) {
    const mt_opt *o = mt_opt_find(t, name);
    const mt_opt_alias *a = o ? NULL : find_alias(t, name, MT_ALIAS_DEPRECATED);
    if (!a) return o;
    o = mt_opt_find(t, a->name);
    MT_ASSERT(o);
    char msg[256], flag[96];
    flag_of(o->name, flag, sizeof flag);
    snprintf(msg, sizeof msg, "--%s is deprecated: it is now spelt --%s (the same option)", name,
             flag);
    if (note) note(user, msg);
    return o;
}

/* The value after a flag that needs one, at argv[*i + 1]. */
static const char *next_value(const mt_opt *o, int argc, char **argv, int *i, const char *label,
                              mt_error *err) {
    if (*i + 1 >= argc || !strncmp(argv[*i + 1], "--", 2)) {
        const char *eg = o->def && o->def[0] ? o->def : o->meta ? o->meta : "VALUE";
        mt_errorf(err, "%s needs a value (e.g. %s %s)", label, label, eg);
        return NULL;
    }
    return argv[++*i];
}

/* "-x [value]": a short spelling. */
static int parse_short(const mt_opt_table *t, void *obj, int argc, char **argv, int *i,
                       mt_error *err) {
    const char *a = argv[*i];
    const mt_opt_alias *al = find_alias(t, a + 1, MT_ALIAS_SHORT);
    if (!al) return unknown_flag(t, "-", a + 1, err);
    const mt_opt *o = mt_opt_find(t, al->name);
    MT_ASSERT(o);
    if (o->type == MT_OPT_BOOL) return mt_opt_set(t, obj, o, "true", a, err);
    const char *value = next_value(o, argc, argv, i, a, err);
    return value ? mt_opt_set(t, obj, o, value, a, err) : -1;
}

int mt_opt_parse_flag(const mt_opt_table *t, void *obj, int argc, char **argv, int *i,
                      mt_opt_note_fn note, void *user, mt_error *err) {
    const char *a = argv[*i];
    if (a[0] == '-' && a[1] && a[1] != '-') return parse_short(t, obj, argc, argv, i, err);
    if (a[0] != '-' || a[1] != '-')
        return mt_errorf(err, "unexpected argument '%s' (options start with --)", a);
    char name[128];
    const char *eq = strchr(a, '='), *value = eq ? eq + 1 : NULL;
    size_t len = eq ? (size_t)(eq - a - 2) : strlen(a + 2);
    if (len >= sizeof name) return mt_errorf(err, "unknown option '%.60s...'", a);
    memcpy(name, a + 2, len);
    name[len] = 0;
    char label[160];
    snprintf(label, sizeof label, "--%s", name);
    const mt_opt *o = flag_option(t, name, note, user);
    if (!o && !strncmp(name, "no-", 3) && !value) {
        o = flag_option(t, name + 3, note, user);
        if (o && o->type == MT_OPT_BOOL) return mt_opt_set(t, obj, o, "false", label, err);
        o = NULL;
    }
    if (!o) return unknown_flag(t, "--", name, err);
    if (o->type == MT_OPT_BOOL && !value) return mt_opt_set(t, obj, o, "true", label, err);
    if (!value && !(value = next_value(o, argc, argv, i, label, err))) return -1;
    return mt_opt_set(t, obj, o, value, label, err);
}

/* Every option without a default was given. */
static int check_required(const mt_opt_table *t, const void *obj, mt_error *err) {
    const bool *given = given_of(t, (void *)obj);
    for (size_t i = 0; i < t->n; i++) {
        const mt_opt *o = &t->opts[i];
        if (o->def || given[i]) continue;
        char flag[96];
        flag_of(o->name, flag, sizeof flag);
        const char *meta = o->meta ? o->meta : "VALUE";
        if (t->positional && !strcmp(o->name, t->positional))
            return mt_errorf(err, "%s is required: megatrain %s %s (or --%s %s)", meta,
                             t->command, meta, flag, meta);
        return mt_errorf(err, "--%s is required: give --%s %s", flag, flag, meta);
    }
    return 0;
}

/* The bare argument a, for t->positional; *bare holds the one before. */
static int take_bare(const mt_opt_table *t, const char *a, const char **bare, mt_error *err) {
    if (!t->positional)
        return mt_errorf(err, "unexpected argument '%s' (options start with --; run "
                              "'megatrain %s --help' for them)", a, t->command);
    if (*bare)
        return mt_errorf(err, "unexpected argument '%s': '%s' was given already (quote an "
                              "argument that holds spaces)", a, *bare);
    *bare = a;
    return 0;
}

int mt_opt_parse(const mt_opt_table *t, void *obj, int argc, char **argv, mt_opt_note_fn note,
                 void *user, mt_error *err) {
    for (int i = 1; i < argc && strcmp(argv[i], "--"); i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) return 1;
    mt_opt_defaults(t, obj);
    const char *bare = NULL;
    bool rest = false; // after "--": every argument is bare
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!rest && !strcmp(a, "--")) rest = true;
        else if (rest || a[0] != '-' || !a[1]) {
            if (take_bare(t, a, &bare, err)) return -1;
        } else if (mt_opt_parse_flag(t, obj, argc, argv, &i, note, user, err)) {
            return -1;
        }
    }
    /* A flag wins over the bare argument, wherever it stands. */
    if (bare && !mt_opt_given(t, obj, t->positional)) {
        const mt_opt *o = mt_opt_find(t, t->positional);
        if (mt_opt_set(t, obj, o, bare, o->meta ? o->meta : o->name, err)) return -1;
    }
    return check_required(t, obj, err);
}

/* --help ------------------------------------------------------------------ */

/* text in words after column `indent` (where the cursor is), up to `width`. */
static void print_wrapped(FILE *f, const char *text, int indent, int width) {
    int col = indent;
    while (*text) {
        int len = (int)strcspn(text, " ");
        if (col > indent && col + 1 + len > width) fprintf(f, "\n%*s", col = indent, "");
        fprintf(f, " %.*s", len, text);
        col += len + 1;
        text += len + (text[len] == ' ');
    }
    fputc('\n', f);
}

/* "-o, --out FILE", "--[no-]name", "--name a|b|c": the flag column. */
static void flag_column(const mt_opt_table *t, const mt_opt *o, char *buf, size_t n) {
    char flag[96], shorts[16] = "";
    flag_of(o->name, flag, sizeof flag);
    for (size_t i = 0; i < t->n_aliases; i++)
        if (t->aliases[i].kind == MT_ALIAS_SHORT && !strcmp(t->aliases[i].name, o->name))
            snprintf(shorts, sizeof shorts, "-%s, ", t->aliases[i].spelling);
    if (o->type == MT_OPT_BOOL) {
        snprintf(buf, n, "%s--[no-]%s", shorts, flag);
        return;
    }
    char choices[128] = "";
    if (o->type == MT_OPT_ENUM) join_choices(o, "|", choices, sizeof choices);
    const char *m = o->meta                   ? o->meta
                    : o->type == MT_OPT_ENUM  ? choices
                    : o->type == MT_OPT_INT   ? "N"
                    : o->type == MT_OPT_FLOAT ? "X" : "S";
    snprintf(buf, n, "%s--%s %s", shorts, flag, m);
}

/* "(default X; tiny model Y; deprecated spelling: --z)" after the help. */
static void default_note(const mt_opt_table *t, const mt_opt *o, char *buf, size_t n) {
    size_t used = 0;
    buf[0] = 0;
    if (!o->def)
        used += (size_t)snprintf(buf, n, "required");
    else if (o->def[0] || o->type == MT_OPT_STRING || o->type == MT_OPT_TEXT)
        used += (size_t)snprintf(buf, n, "default %s", o->def[0] ? o->def : "none");
    if (o->alt_def && used < n)
        used += (size_t)snprintf(buf + used, n - used, "; %s %s", t->alt_def_name, o->alt_def);
    for (size_t i = 0; i < t->n_aliases && used < n; i++) {
        const mt_opt_alias *a = &t->aliases[i];
        if (a->kind != MT_ALIAS_DEPRECATED || strcmp(a->name, o->name)) continue;
        char flag[96];
        flag_of(a->spelling, flag, sizeof flag);
        used += (size_t)snprintf(buf + used, n - used, "%sdeprecated spelling: --%s",
                                 used ? "; " : "", flag);
    }
}

/* "usage: megatrain eval --model DIR --data FILE [options]" and about. */
static void usage_head(const mt_opt_table *t, FILE *f) {
    fprintf(f, "usage: megatrain %s", t->command);
    const mt_opt *bare = t->positional ? mt_opt_find(t, t->positional) : NULL;
    bool optional = false;
    for (size_t i = 0; i < t->n; i++) {
        const mt_opt *o = &t->opts[i];
        char flag[96];
        flag_of(o->name, flag, sizeof flag);
        if (o->def || o == bare) optional |= o != bare;
        else fprintf(f, " --%s %s", flag, o->meta ? o->meta : "VALUE");
    }
    if (optional) fputs(" [options]", f);
    if (bare) fprintf(f, bare->def ? " [%s]" : " %s", bare->meta ? bare->meta : "VALUE");
    fprintf(f, "\n%s\n\n", t->about);
}

void mt_opt_usage(const mt_opt_table *t, FILE *f) {
    if (t->usage) fputs(t->usage, f);
    else usage_head(t, f);
    fprintf(f, "  %-30s this text\n", "--help");
    for (size_t i = 0; i < t->n; i++) {
        const mt_opt *o = &t->opts[i];
        char col[160], note[256], text[768];
        if (o->section) fprintf(f, "\n%s:\n", o->section);
        flag_column(t, o, col, sizeof col);
        default_note(t, o, note, sizeof note);
        snprintf(text, sizeof text, note[0] ? "%s (%s)" : "%s", o->help, note);
        fprintf(f, "  %-30s", col);
        if (strlen(col) > 30) fprintf(f, "\n  %-30s", "");
        print_wrapped(f, text, 32, 80);
    }
}
