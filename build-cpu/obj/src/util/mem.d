build-cpu/obj/src/util/mem.o: src/util/mem.c src/util/mem.h \
 src/util/error.h
src/util/mem.h:
src/util/error.h:
