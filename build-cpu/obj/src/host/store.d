build-cpu/obj/src/host/store.o: src/host/store.c src/host/store.h \
 src/model/params.h src/model/config.h src/util/error.h src/util/mem.h
src/host/store.h:
src/model/params.h:
src/model/config.h:
src/util/error.h:
src/util/mem.h:
