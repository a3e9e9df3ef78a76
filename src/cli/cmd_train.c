/* megatrain train: parses the options (defaults, --config FILE, flags) and
 * runs the training (train/trainer.c). */
#include <stdio.h>

#include "cli/commands.h"
#include "train/train_config.h"
#include "train/trainer.h"

int mt_cmd_train(int argc, char **argv) {
    mt_train_config tc;
    mt_error err;
    int rc = mt_train_config_parse_args(&tc, argc, argv, &err);
    if (rc == 1) return 0;
    if (rc < 0) {
        fprintf(stderr, "megatrain train: %s\n", err.msg);
        return 2;
    }
    rc = mt_train(&tc, &err);
    if (rc < 0) {
        fprintf(stderr, "megatrain train: %s\n", err.msg);
        return 1;
    }
    return rc == 1 ? 130 : 0;
}
