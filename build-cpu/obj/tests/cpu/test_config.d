build-cpu/obj/tests/cpu/test_config.o: tests/cpu/test_config.c \
 src/model/config.h src/util/error.h src/model/params.h
src/model/config.h:
src/util/error.h:
src/model/params.h:
