build-cpu/obj/src/optim/adamw_avx512.o: src/optim/adamw_avx512.c \
 src/optim/kernels.h
src/optim/kernels.h:
