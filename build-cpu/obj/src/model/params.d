build-cpu/obj/src/model/params.o: src/model/params.c src/model/params.h \
 src/model/config.h src/util/error.h src/util/mem.h
src/model/params.h:
src/model/config.h:
src/util/error.h:
src/util/mem.h:
