# megatrain build.
#   make run       set up, build, train the built-in tiny model
#   make test      set up, build, run every test that needs no GPU (C, the
#                  installed library, the Python package: tests/python)
#   make test-gpu  build and run the GPU tests (on a machine with a GPU)
#   make bench     build and run the default benchmarks
#   make test-asan the CPU tests built with AddressSanitizer + UBSan
#   make fuzz      run every fuzz harness (clang + libFuzzer) FUZZ_SECONDS each
#   make install   the binary, libmegatrain.so/.a, megatrain.h and megatrain.pc
#                  under PREFIX (default /usr/local)

CC      ?= gcc
NVCC    ?= $(shell command -v nvcc 2>/dev/null || (test -x /usr/local/cuda/bin/nvcc && echo /usr/local/cuda/bin/nvcc))
BUILD   ?= build
# GPU code: machine code for each architecture (A100, A10/3090, L40S/4090,
# H100/H200) and PTX of the newest for later GPUs. CUDA_GENCODE overrides
# (e.g. PTX for compute_80 only, to test the path every GPU can run).
CUDA_ARCHS ?= 80 86 89 90
CUDA_GENCODE ?= $(foreach a,$(CUDA_ARCHS),-gencode arch=compute_$(a),code=sm_$(a)) \
                -gencode arch=compute_$(lastword $(CUDA_ARCHS)),code=compute_$(lastword $(CUDA_ARCHS))
# -fPIC: the same objects make the static and the shared library.
CFLAGS  := -std=c11 -ffp-contract=off -O2 -g -fPIC -Wall -Wextra -Wno-unused-parameter -fopenmp -D_GNU_SOURCE \
           -Iinclude -Isrc $(EXTRA_CFLAGS)
LDFLAGS ?=
LDLIBS  := -fopenmp -lcjson -lpcre2-8 -lutf8proc -lyaml -lxxhash -lm -lpthread

# The version is written once, in the public header.
VERSION := $(shell sed -n 's/^\#define MT_VERSION "\(.*\)"/\1/p' include/megatrain.h)
SOVERSION := $(firstword $(subst ., ,$(VERSION)))
PREFIX  ?= /usr/local

# Sources: everything under src/ except the CLI (linked into the binary) and
# the CUDA backend (built only when nvcc is present).
LIB_SRC := $(shell find src -name '*.c' -not -path 'src/cli/*' -not -path 'src/backend/cuda/*' | sort)
CLI_SRC := $(shell find src/cli -name '*.c' | sort)
CU_SRC  := $(shell find src -name '*.cu' | sort)
TEST_COMMON_SRC := $(shell find tests/common -name '*.c' | sort)
CPU_TEST_SRC := $(shell find tests/cpu tests/common -name '*.c' | sort)
GPU_TEST_SRC := $(shell find tests/gpu tests/common -name '*.c' | sort)

LIB_OBJ := $(LIB_SRC:%.c=$(BUILD)/obj/%.o)
CLI_OBJ := $(CLI_SRC:%.c=$(BUILD)/obj/%.o)
CPU_TEST_OBJ := $(CPU_TEST_SRC:%.c=$(BUILD)/obj/%.o)
GPU_TEST_OBJ := $(GPU_TEST_SRC:%.c=$(BUILD)/obj/%.o)

ifneq ($(NVCC),)
CUDA_HOME := $(patsubst %/bin/nvcc,%,$(NVCC))
CU_OBJ  := $(CU_SRC:%.cu=$(BUILD)/obj/%.o)
# Host code of the CUDA backend: C, compiled only when CUDA is present.
LIB_SRC += $(shell find src/backend/cuda -name '*.c' | sort)
LIB_OBJ := $(LIB_SRC:%.c=$(BUILD)/obj/%.o)
CFLAGS  += -DMT_HAVE_CUDA -I$(CUDA_HOME)/include
NVFLAGS := -std=c++17 -O3 -g -lineinfo $(CUDA_GENCODE) -Isrc -DMT_HAVE_CUDA -Xcompiler -fopenmp,-Wall,-fPIC
LDLIBS  += -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 -lcublasLt -lcublas -lcudart -lstdc++
# The GPU code asked of nvcc (sm_NN: machine code, compute_NN: PTX), for
# `megatrain --version` (mt_cuda_archs).
CUDA_CODES := $(strip $(foreach w,$(CUDA_GENCODE),$(if $(findstring code=,$(w)),$(lastword $(subst code=, ,$(w))))))
else
CUDA_CODES := none (CPU only)
endif

# Files named *_avx512.c / *_avx2.c hold kernels for one instruction set,
# chosen at run time; only they are compiled with those extensions.
$(BUILD)/obj/%_avx512.o: EXTRA_ISA := -mavx512f -mavx512bw -mavx512vl -mavx512dq -mfma -mavx2
$(BUILD)/obj/%_avx2.o: EXTRA_ISA := -mavx2 -mfma -mf16c

.PHONY: all setup build run test test-asan fuzz test-gpu gpu-bundle bench clean fixtures install FORCE

all: build

build: $(BUILD)/megatrain $(BUILD)/mt_tests $(BUILD)/libmegatrain.so

setup:
	@scripts/setup.sh

$(BUILD)/obj/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(EXTRA_ISA) -MMD -MP -c $< -o $@

$(BUILD)/obj/%.o: %.cu
	@mkdir -p $(dir $@)
	$(NVCC) $(NVFLAGS) -MMD -MP -c $< -o $@

$(BUILD)/libmegatrain.a: $(LIB_OBJ) $(CU_OBJ)
	@rm -f $@
	ar rcs $@ $^

# The shared library exports the calls of include/megatrain.h only.
$(BUILD)/libmegatrain.map: include/megatrain.h
	@mkdir -p $(dir $@)
	{ echo '{ global:'; grep -o '\bmt_[a-z0-9_]*(' $< | tr -d '(' | sort -u | sed 's/$$/;/'; \
	  echo 'local: *; };'; } > $@

$(BUILD)/libmegatrain.so: $(LIB_OBJ) $(CU_OBJ) $(BUILD)/libmegatrain.map
	$(CC) -shared -Wl,-soname,libmegatrain.so.$(SOVERSION) \
	    -Wl,--version-script=$(BUILD)/libmegatrain.map $(LDFLAGS) -o $@ $(LIB_OBJ) $(CU_OBJ) $(LDLIBS)

# mt_cuda_archs(): the list is rewritten only when it changes, so that a
# build with other CUDA_GENCODE recompiles the one file that prints it.
$(BUILD)/cuda_codes.txt: FORCE
	@mkdir -p $(dir $@)
	@echo '$(CUDA_CODES)' | cmp -s - $@ || echo '$(CUDA_CODES)' > $@
$(BUILD)/obj/src/train/api.o: $(BUILD)/cuda_codes.txt
$(BUILD)/obj/src/train/api.o: CFLAGS += -DMT_CUDA_ARCHS='"$(CUDA_CODES)"'

# The binary carries the library (static): it runs without LD_LIBRARY_PATH.
$(BUILD)/megatrain: $(CLI_OBJ) $(BUILD)/libmegatrain.a
	$(CC) $(LDFLAGS) -o $@ $(CLI_OBJ) $(BUILD)/libmegatrain.a $(LDLIBS)

# The tests link the library only; the commands they run are the binary's
# (tests/common/testlib.h: mt_test_cli), so it is built first.
$(BUILD)/mt_tests: $(CPU_TEST_OBJ) $(BUILD)/libmegatrain.a | $(BUILD)/megatrain
	$(CC) $(LDFLAGS) -o $@ $(CPU_TEST_OBJ) $(BUILD)/libmegatrain.a $(LDLIBS) -lcriterion

# pkg-config: Libs for the shared library; Libs.private for static linking.
$(BUILD)/megatrain.pc: FORCE
	@printf '%s\n' 'prefix=$(PREFIX)' 'libdir=$${prefix}/lib' 'includedir=$${prefix}/include' '' \
	    'Name: megatrain' \
	    'Description: full-precision training of Llama-family models on one GPU' \
	    'Version: $(VERSION)' 'Cflags: -I$${includedir}' 'Libs: -L$${libdir} -lmegatrain' \
	    'Libs.private: $(LDLIBS)' > $@.tmp
	@cmp -s $@.tmp $@ && rm $@.tmp || mv $@.tmp $@

install: $(BUILD)/megatrain $(BUILD)/libmegatrain.so $(BUILD)/libmegatrain.a $(BUILD)/megatrain.pc
	install -d $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(PREFIX)/lib/pkgconfig $(DESTDIR)$(PREFIX)/include
	install -m 755 $(BUILD)/megatrain $(DESTDIR)$(PREFIX)/bin/megatrain
	install -m 644 $(BUILD)/libmegatrain.a $(DESTDIR)$(PREFIX)/lib/libmegatrain.a
	install -m 755 $(BUILD)/libmegatrain.so $(DESTDIR)$(PREFIX)/lib/libmegatrain.so.$(VERSION)
	ln -sf libmegatrain.so.$(VERSION) $(DESTDIR)$(PREFIX)/lib/libmegatrain.so.$(SOVERSION)
	ln -sf libmegatrain.so.$(SOVERSION) $(DESTDIR)$(PREFIX)/lib/libmegatrain.so
	install -m 644 include/megatrain.h $(DESTDIR)$(PREFIX)/include/megatrain.h
	install -m 644 $(BUILD)/megatrain.pc $(DESTDIR)$(PREFIX)/lib/pkgconfig/megatrain.pc

$(BUILD)/mt_gpu_tests: $(GPU_TEST_OBJ) $(BUILD)/libmegatrain.a
	$(CC) -o $@ $(GPU_TEST_OBJ) $(BUILD)/libmegatrain.a $(LDLIBS) -lcriterion

run: setup
	@$(MAKE) --no-print-directory $(BUILD)/megatrain
	$(BUILD)/megatrain train

test: setup
	@$(MAKE) --no-print-directory build
	$(BUILD)/mt_tests --jobs 2
	scripts/test_install.sh $(BUILD)
	scripts/test_python.sh $(BUILD)

# The CPU library and tests with AddressSanitizer + UBSan, in their own
# build directory; the first error of either kind fails the run.
SAN_FLAGS := -fsanitize=address,undefined,float-cast-overflow -fno-sanitize-recover=all -fno-omit-frame-pointer
test-asan: setup
	@$(MAKE) --no-print-directory BUILD=$(BUILD)/asan NVCC= EXTRA_CFLAGS="$(SAN_FLAGS)" \
	    LDFLAGS="$(SAN_FLAGS)" $(BUILD)/asan/mt_tests
	scripts/test_asan.sh $(BUILD)/asan/mt_tests

# Every fuzz harness of tests/fuzz/ (clang + libFuzzer), FUZZ_SECONDS each.
FUZZ_SECONDS ?= 60
fuzz: setup
	scripts/fuzz.sh $(FUZZ_SECONDS)

# On a GPU machine without the build dependencies, the binaries built
# elsewhere (make gpu-bundle) are used as they are.
test-gpu:
	@if scripts/setup.sh --check; then \
	    $(MAKE) --no-print-directory $(BUILD)/mt_gpu_tests $(BUILD)/megatrain; \
	else echo "test-gpu: build dependencies absent here; running the binaries in $(BUILD)/"; fi
	LD_LIBRARY_PATH=$(BUILD)/lib:$$LD_LIBRARY_PATH $(BUILD)/mt_gpu_tests --jobs 1
	LD_LIBRARY_PATH=$(BUILD)/lib:$$LD_LIBRARY_PATH tests/gpu/hf_roundtrip.sh

# Builds the GPU test binary and the CLI and copies the non-CUDA shared
# libraries they load into build/lib, for running on a bare GPU machine.
gpu-bundle: $(BUILD)/mt_gpu_tests $(BUILD)/megatrain
	scripts/bundle_libs.sh $(BUILD)/mt_gpu_tests $(BUILD)/megatrain

bench: $(BUILD)/megatrain
	$(BUILD)/megatrain bench adamw

fixtures:
	python3 scripts/make_fixtures.py
	python3 scripts/make_packed_fixture.py

clean:
	rm -rf $(BUILD)

-include $(shell find $(BUILD)/obj -name '*.d' 2>/dev/null)

$(BUILD)/obj/tests/%.o: CFLAGS += -Itests/common
