build-cpu/obj/src/model/rope.o: src/model/rope.c src/model/rope.h \
 src/model/config.h src/util/error.h src/util/mem.h
src/model/rope.h:
src/model/config.h:
src/util/error.h:
src/util/mem.h:
