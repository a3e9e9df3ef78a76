build-cpu/obj/src/engine/optim_pipeline.o: src/engine/optim_pipeline.c \
 src/engine/optim_pipeline.h src/engine/optimizer.h src/host/store.h \
 src/model/params.h src/model/config.h src/util/error.h src/optim/adamw.h \
 src/optim/schedule.h
src/engine/optim_pipeline.h:
src/engine/optimizer.h:
src/host/store.h:
src/model/params.h:
src/model/config.h:
src/util/error.h:
src/optim/adamw.h:
src/optim/schedule.h:
