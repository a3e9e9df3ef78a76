build-cpu/obj/src/io/dtype.o: src/io/dtype.c src/io/dtype.h
src/io/dtype.h:
