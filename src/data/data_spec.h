/* What a run's `data` option names: one source (a file, or a directory of
 * shards), or several sources mixed with weights.
 *
 * A mixture is written as a YAML list, in the config file
 *
 *     data:
 *       - {path: web.jsonl.zst, weight: 0.7}
 *       - {path: code/, weight: 0.3}
 *
 * or as the same text on the command line (`--data '[{path: a.jsonl,
 * weight: 0.7}, {path: b/, weight: 0.3}]'`). An item may be a bare path
 * (weight 1). Weights are positive and need not sum to 1: they are
 * normalised. The list is kept in the config as its canonical text,
 * `[{path: "a.jsonl", weight: 0.7}, ...]`, so that two spellings of one
 * mixture compare equal (a resumed run must keep its data). */
#ifndef MT_DATA_DATA_SPEC_H
#define MT_DATA_DATA_SPEC_H

#include <stdbool.h>
#include <stddef.h>
#include <yaml.h>

#include "util/error.h"

typedef struct mt_data_source {
    char *path;     // a file or a directory of shards
    double weight;  // > 0, as given (not normalised)
} mt_data_source;

typedef struct mt_data_spec {
    mt_data_source *src;  // (n)
    size_t n;
    bool is_list;  // written as a list (even of one source)
} mt_data_spec;

/* Whether text is a list (its first non-blank character is '['). */
bool mt_data_spec_is_list(const char *text);

/* Parses text: a list, or else one path taken as it is. `what` names the
 * option in messages ("data"). An empty text is an error. */
int mt_data_spec_parse(const char *text, const char *what, mt_data_spec *spec, mt_error *err);
void mt_data_spec_free(mt_data_spec *spec);

/* Checks the value of option `what`: empty (no data) or a path is fine; a
 * list must parse, with positive weights; allow_list = false refuses one. */
int mt_data_spec_check(const char *text, const char *what, bool allow_list, mt_error *err);

/* The canonical text of a list spec into buf (cap bytes); -1 when it does
 * not fit (names `what` and the fix). */
int mt_data_spec_format(const mt_data_spec *spec, const char *what, char *buf, size_t cap,
                        mt_error *err);

/* Rewrites text (a list) into its canonical form in place; leaves text
 * untouched when it is a path, or a list that does not parse (the error is
 * reported by the validation that follows). */
void mt_data_spec_canonicalize(char *text, size_t cap);

/* For YAML readers: the parser of `file` has just returned the
 * SEQUENCE-START event of `what`'s value; reads the list to its end and
 * writes its canonical text into buf. Errors name file:line. */
int mt_data_spec_read_yaml(yaml_parser_t *parser, const char *file, const char *what, char *buf,
                           size_t cap, mt_error *err);

#endif
