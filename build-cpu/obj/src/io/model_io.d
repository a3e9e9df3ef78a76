build-cpu/obj/src/io/model_io.o: src/io/model_io.c src/io/model_io.h \
 src/host/store.h src/model/params.h src/model/config.h src/util/error.h \
 src/io/dtype.h src/io/safetensors.h src/util/mem.h
src/io/model_io.h:
src/host/store.h:
src/model/params.h:
src/model/config.h:
src/util/error.h:
src/io/dtype.h:
src/io/safetensors.h:
src/util/mem.h:
