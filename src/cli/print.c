/* How the command line shows what the library reports: information and
 * progress lines on stdout, warnings on stderr after "megatrain: ",
 * generated text as it comes. */
#include "cli/commands.h"

#include <stdio.h>

void mt_cli_print_event(const mt_event *ev, void *user) {
    (void)user;
    switch (ev->kind) {
    case MT_EVENT_INFO:
        printf("%s\n", ev->text);
        break;
    case MT_EVENT_WARNING:
        fprintf(stderr, "megatrain: %s\n", ev->text);
        break;
    case MT_EVENT_STEP:
        if (!ev->text) break;
        printf("%s\n", ev->text);
        fflush(stdout);
        break;
    case MT_EVENT_TEXT:
        fputs(ev->text, stdout);
        fflush(stdout);
        break;
    }
}
