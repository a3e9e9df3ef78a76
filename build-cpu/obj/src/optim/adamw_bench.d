build-cpu/obj/src/optim/adamw_bench.o: src/optim/adamw_bench.c \
 src/optim/adamw.h src/util/error.h src/util/mem.h
src/optim/adamw.h:
src/util/error.h:
src/util/mem.h:
