build-cpu/obj/src/engine/optimizer.o: src/engine/optimizer.c \
 src/engine/optimizer.h src/host/store.h src/model/params.h \
 src/model/config.h src/util/error.h src/optim/adamw.h \
 src/optim/schedule.h src/optim/clip.h
src/engine/optimizer.h:
src/host/store.h:
src/model/params.h:
src/model/config.h:
src/util/error.h:
src/optim/adamw.h:
src/optim/schedule.h:
src/optim/clip.h:
