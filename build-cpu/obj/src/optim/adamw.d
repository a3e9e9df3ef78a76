build-cpu/obj/src/optim/adamw.o: src/optim/adamw.c src/optim/adamw.h \
 src/util/error.h src/optim/kernels.h
src/optim/adamw.h:
src/util/error.h:
src/optim/kernels.h:
