build-cpu/obj/src/engine/step.o: src/engine/step.c src/engine/step.h \
 src/engine/backend.h src/util/error.h src/backend/cpu/ops.h
src/engine/step.h:
src/engine/backend.h:
src/util/error.h:
src/backend/cpu/ops.h:
