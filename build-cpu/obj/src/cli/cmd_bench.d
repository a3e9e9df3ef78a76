build-cpu/obj/src/cli/cmd_bench.o: src/cli/cmd_bench.c src/cli/commands.h \
 src/optim/adamw.h src/util/error.h
src/cli/commands.h:
src/optim/adamw.h:
src/util/error.h:
