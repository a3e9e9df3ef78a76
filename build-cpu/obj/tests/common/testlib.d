build-cpu/obj/tests/common/testlib.o: tests/common/testlib.c \
 tests/common/testlib.h
tests/common/testlib.h:
