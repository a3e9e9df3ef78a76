build-cpu/obj/src/backend/cpu/backend_cpu.o: \
 src/backend/cpu/backend_cpu.c src/backend/cpu/backend_cpu.h \
 src/engine/backend.h src/util/error.h src/host/store.h \
 src/model/params.h src/model/config.h src/backend/cpu/ops.h \
 src/model/rope.h src/util/mem.h
src/backend/cpu/backend_cpu.h:
src/engine/backend.h:
src/util/error.h:
src/host/store.h:
src/model/params.h:
src/model/config.h:
src/backend/cpu/ops.h:
src/model/rope.h:
src/util/mem.h:
