build-cpu/obj/tests/cpu/test_model_hf.o: tests/cpu/test_model_hf.c \
 src/backend/cpu/backend_cpu.h src/engine/backend.h src/util/error.h \
 src/host/store.h src/model/params.h src/model/config.h \
 src/backend/cpu/ops.h src/engine/optimizer.h src/optim/adamw.h \
 src/optim/schedule.h src/engine/step.h src/io/model_io.h src/io/dtype.h \
 src/io/safetensors.h tests/common/testlib.h
src/backend/cpu/backend_cpu.h:
src/engine/backend.h:
src/util/error.h:
src/host/store.h:
src/model/params.h:
src/model/config.h:
src/backend/cpu/ops.h:
src/engine/optimizer.h:
src/optim/adamw.h:
src/optim/schedule.h:
src/engine/step.h:
src/io/model_io.h:
src/io/dtype.h:
src/io/safetensors.h:
tests/common/testlib.h:
