build-cpu/obj/src/optim/adamw_avx2.o: src/optim/adamw_avx2.c \
 src/optim/kernels.h
src/optim/kernels.h:
