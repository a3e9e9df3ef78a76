/* Events to the caller and the per-thread last error. */
#include "train/events.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Like errno: one message per thread, kept until the next failing call. */
static _Thread_local mt_error last_error;

void mt_emit(const mt_events *ev, mt_event_kind kind, const char *text) {
    if (!ev || !ev->fn) return;
    mt_event e = {.kind = kind, .text = text};
    ev->fn(&e, ev->user);
}

void mt_emitf(const mt_events *ev, mt_event_kind kind, const char *fmt, ...) {
    if (!ev || !ev->fn) return;
    char buf[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    mt_event e = {.kind = kind, .text = buf};
    ev->fn(&e, ev->user);
}

void mt_emit_lines(const mt_events *ev, mt_event_kind kind, const char *text) {
    if (!ev || !ev->fn || !text) return;
    while (*text) {
        size_t n = strcspn(text, "\n");
        char *line = strndup(text, n);
        MT_ASSERT(line);
        mt_event e = {.kind = kind, .text = line};
        ev->fn(&e, ev->user);
        free(line);
        text += n + (text[n] == '\n');
    }
}

int mt_set_last_error(const mt_error *err) {
    snprintf(last_error.msg, sizeof last_error.msg, "%s", err->msg);
    return -1;
}

const char *mt_last_error(void) { return last_error.msg; }

void mt_free(void *p) { free(p); }
