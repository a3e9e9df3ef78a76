build-cpu/obj/src/io/safetensors.o: src/io/safetensors.c \
 src/io/safetensors.h src/io/dtype.h src/util/error.h src/io/file.h \
 src/util/mem.h
src/io/safetensors.h:
src/io/dtype.h:
src/util/error.h:
src/io/file.h:
src/util/mem.h:
