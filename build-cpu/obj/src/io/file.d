build-cpu/obj/src/io/file.o: src/io/file.c src/io/file.h src/util/error.h \
 src/util/mem.h
src/io/file.h:
src/util/error.h:
src/util/mem.h:
