build-cpu/obj/tests/cpu/test_cpu_ops.o: tests/cpu/test_cpu_ops.c \
 src/backend/cpu/ops.h tests/common/testlib.h
src/backend/cpu/ops.h:
tests/common/testlib.h:
