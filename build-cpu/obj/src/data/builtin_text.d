build-cpu/obj/src/data/builtin_text.o: src/data/builtin_text.c \
 src/data/builtin_text.h src/util/mem.h
src/data/builtin_text.h:
src/util/mem.h:
