/* Reporting from inside the library: events to the caller's callback
 * (megatrain.h: mt_event_fn), and the per-thread last error that the
 * public calls leave for mt_last_error. */
#ifndef MT_TRAIN_EVENTS_H
#define MT_TRAIN_EVENTS_H

#include "megatrain.h"
#include "util/error.h"

/* Where events go: fn (NULL: nowhere) with its user pointer. */
typedef struct mt_events {
    mt_event_fn fn;
    void *user;
} mt_events;

/* An event of kind (INFO, WARNING, TEXT) with text as it is. */
void mt_emit(const mt_events *ev, mt_event_kind kind, const char *text);

/* The same with the text formatted (up to 4 KB). */
void mt_emitf(const mt_events *ev, mt_event_kind kind, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Each line of text (split at '\n', the last one without a newline
 * ignored when empty) as an event of kind. */
void mt_emit_lines(const mt_events *ev, mt_event_kind kind, const char *text);

/* Makes err's message this thread's last error; returns -1. */
int mt_set_last_error(const mt_error *err);

#endif
