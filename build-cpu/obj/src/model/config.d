build-cpu/obj/src/model/config.o: src/model/config.c src/model/config.h \
 src/util/error.h src/util/mem.h
src/model/config.h:
src/util/error.h:
src/util/mem.h:
