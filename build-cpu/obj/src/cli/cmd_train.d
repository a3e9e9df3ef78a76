build-cpu/obj/src/cli/cmd_train.o: src/cli/cmd_train.c \
 src/backend/cpu/backend_cpu.h src/engine/backend.h src/util/error.h \
 src/host/store.h src/model/params.h src/model/config.h \
 src/backend/cpu/ops.h src/cli/commands.h src/data/builtin_text.h \
 src/engine/optimizer.h src/optim/adamw.h src/optim/schedule.h \
 src/engine/step.h
src/backend/cpu/backend_cpu.h:
src/engine/backend.h:
src/util/error.h:
src/host/store.h:
src/model/params.h:
src/model/config.h:
src/backend/cpu/ops.h:
src/cli/commands.h:
src/data/builtin_text.h:
src/engine/optimizer.h:
src/optim/adamw.h:
src/optim/schedule.h:
src/engine/step.h:
