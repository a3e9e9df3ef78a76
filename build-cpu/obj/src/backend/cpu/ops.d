build-cpu/obj/src/backend/cpu/ops.o: src/backend/cpu/ops.c \
 src/backend/cpu/ops.h src/util/error.h src/util/mem.h
src/backend/cpu/ops.h:
src/util/error.h:
src/util/mem.h:
