/* Values of the Jinja engine: what a chat template computes with, with the
 * semantics of the Python objects jinja2 hands it (str, int, float, bool,
 * None, list, tuple, dict, jinja2's Undefined and Namespace).
 *
 * Every value of a render lives in one pool (mt_jpool): allocation is a
 * pointer bump, nothing is freed one by one, and mt_jpool_reset drops the
 * whole render at once. Values are small structs passed by value; strings,
 * lists and dicts point into the pool and are never changed once built,
 * except a namespace's attributes (`{% set ns.x = ... %}`), as in jinja2's
 * immutable sandbox.
 *
 * Strings are UTF-8 bytes (not NUL-terminated); where Python counts
 * characters (len, indexing, slicing) the engine counts code points. */
#ifndef MT_DATA_JINJA_VALUE_H
#define MT_DATA_JINJA_VALUE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "data/jinja/jinja_str.h"
#include "util/error.h"

/* ---- the pool ---- */

typedef struct mt_jpool_chunk mt_jpool_chunk;
typedef struct mt_jpool {
    mt_jpool_chunk *head;  // newest chunk first
    size_t used, cap;      // of head
} mt_jpool;

/* n zeroed bytes aligned to 16, valid until the next reset. Never fails
 * (aborts when memory is exhausted). */
void *mt_jpool_alloc(mt_jpool *p, size_t n);
/* A copy of s[0..n) in the pool, NUL-terminated. */
char *mt_jpool_strdup(mt_jpool *p, const char *s, size_t n);
/* Drops every value; keeps the first chunk for reuse. */
void mt_jpool_reset(mt_jpool *p);
void mt_jpool_free(mt_jpool *p);

/* ---- values ---- */

typedef enum mt_jv_type {
    MT_JV_UNDEF,   // jinja2's Undefined: prints as "", false, an error when used further
    MT_JV_NONE,
    MT_JV_BOOL,
    MT_JV_INT,
    MT_JV_FLOAT,
    MT_JV_STR,
    MT_JV_LIST,    // list, or tuple when .tuple
    MT_JV_DICT,
    MT_JV_NS,      // namespace(): a dict whose attributes may be set
    MT_JV_FUNC,    // a global function (range, namespace, raise_exception, ...)
    MT_JV_METHOD,  // a method bound to its object ('a b'.split)
    MT_JV_MACRO,   // a {% macro %}
    MT_JV_LOOP,    // the `loop` of a for loop
} mt_jv_type;

typedef struct mt_jlist mt_jlist;
typedef struct mt_jdict mt_jdict;
typedef struct mt_jmethod mt_jmethod;

typedef struct mt_jv {
    uint8_t type;  // mt_jv_type
    bool tuple;    // MT_JV_LIST: a tuple
    union {
        bool b;
        int64_t i;
        double f;
        struct {
            const char *p;
            size_t n;
        } s;                    // MT_JV_STR
        mt_jlist *l;            // MT_JV_LIST
        mt_jdict *d;            // MT_JV_DICT, MT_JV_NS
        mt_jmethod *m;          // MT_JV_METHOD
        int fn;                 // MT_JV_FUNC: index into the engine's table
        const void *obj;        // MT_JV_MACRO, MT_JV_LOOP: the engine's object
        const char *undef;      // MT_JV_UNDEF: what was missing, for messages (may be NULL)
    };
} mt_jv;

struct mt_jlist {
    mt_jv *v;  // (n)
    size_t n, cap;
};

struct mt_jdict {
    mt_jv *k, *v;  // (n) keys and values in insertion order
    size_t n, cap;
    int32_t msg;   // index of the message this dict is, or -1 (see jinja.h)
};

struct mt_jmethod {
    mt_jv self;
    const char *name;
};

static inline mt_jv mt_jv_undef(const char *what) { return (mt_jv){.type = MT_JV_UNDEF, .undef = what}; }
static inline mt_jv mt_jv_none(void) { return (mt_jv){.type = MT_JV_NONE}; }
static inline mt_jv mt_jv_bool(bool b) { return (mt_jv){.type = MT_JV_BOOL, .b = b}; }
static inline mt_jv mt_jv_int(int64_t i) { return (mt_jv){.type = MT_JV_INT, .i = i}; }
static inline mt_jv mt_jv_float(double f) { return (mt_jv){.type = MT_JV_FLOAT, .f = f}; }
/* A string pointing at s (not copied: s must outlive the render). */
static inline mt_jv mt_jv_strn(const char *s, size_t n) {
    return (mt_jv){.type = MT_JV_STR, .s = {s, n}};
}
mt_jv mt_jv_cstr(const char *s);
/* A string copied into the pool. */
mt_jv mt_jv_str_copy(mt_jpool *p, const char *s, size_t n);

mt_jv mt_jv_list_new(mt_jpool *p, size_t cap);
void mt_jv_list_push(mt_jpool *p, mt_jv list, mt_jv item);
mt_jv mt_jv_dict_new(mt_jpool *p, size_t cap);
/* Sets key (equal keys replace the value, keeping the position, as a
 * Python dict does). */
void mt_jv_dict_set(mt_jpool *p, mt_jv dict, mt_jv key, mt_jv val);
/* The value of key, or an Undefined when absent. */
mt_jv mt_jv_dict_get(mt_jv dict, mt_jv key);
/* The same with a C string key; NULL-safe on non-dicts. */
mt_jv mt_jv_dict_gets(mt_jv dict, const char *key);

/* Python's truth value (Undefined is false). */
bool mt_jv_truthy(mt_jv v);
/* Python's ==. */
bool mt_jv_equal(mt_jv a, mt_jv b);
/* Python's <, for numbers, strings and sequences: 0 with *lt set, or -1
 * when the types cannot be ordered. */
int mt_jv_less(mt_jv a, mt_jv b, bool *lt);
/* The Python type name of a value ("str", "dict", ...), for messages. */
const char *mt_jv_type_name(mt_jv v);

/* ---- text ---- */

/* str(v) appended to b: what {{ v }} prints (Undefined prints nothing,
 * None "None", lists and dicts as Python's repr). */
void mt_jv_str(mt_jbuf *b, mt_jv v);
/* repr(v) appended to b. */
void mt_jv_repr(mt_jbuf *b, mt_jv v);
/* Python's repr of a float ("1.0", "1e-05", "0.30000000000000004"). */
void mt_jv_float_repr(mt_jbuf *b, double f);
/* str(v) as a string value in the pool (a string is returned as is). */
mt_jv mt_jv_to_str(mt_jpool *p, mt_jv v);

/* ---- JSON (jinja_json.c) ---- */

/* Parses JSON text into values as Python's json.loads does (integers as
 * int, numbers with a fraction or exponent as float, objects keep their key
 * order, a repeated key keeps its first position and last value). -1 with
 * err ("not valid JSON at byte N") otherwise. */
int mt_jv_from_json(mt_jpool *p, const char *json, size_t len, mt_jv *out, mt_error *err);

typedef struct mt_jjson_opts {
    const char *indent;  // NULL: one line; else the indent unit (json.dumps' indent)
    const char *item_sep, *key_sep;  // NULL: json.dumps' defaults for the indent
    bool sort_keys;
} mt_jjson_opts;

/* json.dumps(v, ensure_ascii=False, ...) appended to b: transformers'
 * tojson. -1 with err naming the value that JSON cannot hold. */
int mt_jv_to_json(mt_jbuf *b, mt_jv v, const mt_jjson_opts *o, mt_error *err);

#endif
