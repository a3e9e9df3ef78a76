build-cpu/obj/src/optim/schedule.o: src/optim/schedule.c \
 src/optim/schedule.h src/util/error.h
src/optim/schedule.h:
src/util/error.h:
