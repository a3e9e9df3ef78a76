build-cpu/obj/src/cli/bench_train.o: src/cli/bench_train.c \
 src/cli/commands.h src/engine/optim_pipeline.h src/engine/optimizer.h \
 src/host/store.h src/model/params.h src/model/config.h src/util/error.h \
 src/optim/adamw.h src/optim/schedule.h src/engine/step.h \
 src/engine/backend.h
src/cli/commands.h:
src/engine/optim_pipeline.h:
src/engine/optimizer.h:
src/host/store.h:
src/model/params.h:
src/model/config.h:
src/util/error.h:
src/optim/adamw.h:
src/optim/schedule.h:
src/engine/step.h:
src/engine/backend.h:
