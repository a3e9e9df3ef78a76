build-cpu/obj/src/optim/clip.o: src/optim/clip.c src/optim/clip.h \
 src/optim/adamw.h src/util/error.h src/optim/kernels.h
src/optim/clip.h:
src/optim/adamw.h:
src/util/error.h:
src/optim/kernels.h:
