# dmove build. `make` builds libdmove.a and the dmove command; `make test` runs every test.
# Probes print what they found (BLAS, OpenMP, cJSON, nvcc).

CC      ?= cc
CFLAGS  ?= -O3 -march=native -g
CFLAGS  += -std=c11 -D_GNU_SOURCE -fno-trapping-math -fno-math-errno -Wall -Wextra -Wno-unused-parameter -Wno-format-truncation -fopenmp -Iinclude -Isrc
LDLIBS  += -lm
BUILD   ?= build

# --- probes ---------------------------------------------------------------------------
BLAS_INC := $(firstword $(wildcard /usr/include/x86_64-linux-gnu/openblas-openmp /usr/include/openblas))
BLAS_LIB := $(firstword $(wildcard /usr/lib/x86_64-linux-gnu/openblas-openmp/libopenblas.so /usr/lib/x86_64-linux-gnu/libopenblas.so))
ifeq ($(BLAS_LIB),)
$(error BLAS not found: install the OpenMP build of OpenBLAS: apt-get install libopenblas-openmp-dev)
endif
CFLAGS += -I$(BLAS_INC)
LDLIBS += -L$(dir $(BLAS_LIB)) -Wl,-rpath,$(dir $(BLAS_LIB)) -lopenblas
ifeq ($(wildcard /usr/include/cjson/cJSON.h),)
$(error cJSON not found: apt-get install libcjson-dev)
endif
LDLIBS += -lcjson
# expat: the SVG test parses the roofline chart (tests/test_analysis.c)
ifeq ($(wildcard /usr/include/expat.h),)
$(error expat not found: apt-get install libexpat1-dev)
endif
LDLIBS += -lexpat
# CUDA backend (src/cuda, src/cudagen, src/cudaexec): built when nvcc is found, on PATH or
# as /usr/local/cuda/bin/nvcc, with cuBLAS beside it. `make NVCC= BUILD=build-nocuda` builds the CPU backend alone (a
# build folder remembers its CUDA setting in config.stamp and rebuilds when it changes).
NVCC ?= $(or $(shell command -v nvcc 2>/dev/null),$(wildcard /usr/local/cuda/bin/nvcc))
HAVE_CUDA :=
# The backends built (src/plan/backend.h), registered by src/layer/backends.c: a backend is
# its folder and a line here.
BACKENDS := cpu
ifeq ($(NVCC),)
ifeq ($(origin NVCC),command line)
CUDA_WHY := NVCC= given: CPU backend only
else
CUDA_WHY := nvcc not found (not on PATH, no /usr/local/cuda/bin/nvcc): CPU backend only
endif
else
CUDA_HOME ?= $(patsubst %/bin/nvcc,%,$(realpath $(NVCC)))
CUDA_LIBDIR := $(dir $(firstword $(wildcard $(CUDA_HOME)/lib64/libcublas.so $(CUDA_HOME)/targets/x86_64-linux/lib/libcublas.so)))
ifeq ($(CUDA_LIBDIR),)
CUDA_WHY := $(NVCC) found, but no libcublas.so under $(CUDA_HOME): CPU backend only
else
HAVE_CUDA := 1
BACKENDS += cuda
NVCC_VERSION := $(shell $(NVCC) --version 2>/dev/null | sed -n 's/.*release \([0-9.]*\).*/\1/p')
# sm_80 (A100), sm_90 (H100/H200), and compute_90 PTX that newer GPUs compile at load time
NVCC_ARCH ?= -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=sm_90 -gencode arch=compute_90,code=compute_90
NVCCFLAGS ?= -O3 -lineinfo
NVCCFLAGS += -std=c++17 $(NVCC_ARCH) -Xcompiler -fopenmp,-Wall,-Wextra,-Wno-unused-parameter -Iinclude -Isrc -DDM_HAVE_CUDA
CFLAGS += -DDM_HAVE_CUDA
# NVRTC compiles the row kernels generated per fused group (src/cudagen/) at run time,
# with the toolkit's headers; the tests build the same code for the host with $(CXX)
CXX ?= c++
NVCCFLAGS += -DDM_CUDA_INCLUDE='"$(CUDA_HOME)/include"' -DDM_HOST_CXX='"$(CXX)"'
LDLIBS += -L$(CUDA_LIBDIR) -Wl,-rpath,$(CUDA_LIBDIR) -lcublasLt -lcublas -lnvrtc -lcudart -ldl -lstdc++
CUDA_WHY := $(NVCC) (release $(NVCC_VERSION)), cuBLAS in $(CUDA_LIBDIR): CUDA backend built (sm_80, sm_90)
endif
endif

$(info dmove build: BLAS  $(BLAS_LIB) (OpenBLAS, OpenMP build))
$(info dmove build: cJSON /usr/include/cjson)
$(info dmove build: expat /usr/include/expat.h (SVG test))
$(info dmove build: OpenMP via -fopenmp ($(CC)))
$(info dmove build: CUDA  $(CUDA_WHY))

# Objects differ with and without CUDA (DM_HAVE_CUDA): a change of setting rebuilds.
# (Not touched by a dry run, make -n.)
CONFIG_STAMP := $(BUILD)/config.stamp
BUILD_CONFIG := cuda=$(HAVE_CUDA) nvcc=$(NVCC)
ifeq ($(findstring n,$(firstword -$(MAKEFLAGS))),)
$(shell mkdir -p $(BUILD) && { [ "$$(cat $(CONFIG_STAMP) 2>/dev/null)" = "$(BUILD_CONFIG)" ] || echo "$(BUILD_CONFIG)" > $(CONFIG_STAMP); })
endif

# --- sources ----------------------------------------------------------------------------
LIB_SRC := $(wildcard src/core/*.c src/graph/*.c src/analysis/*.c src/plan/*.c src/tune/*.c src/train/*.c src/cpu/*.c src/layer/*.c)
CLI_SRC := $(wildcard cli/*.c)
LIB_OBJ := $(LIB_SRC:%.c=$(BUILD)/%.o)
ifneq ($(HAVE_CUDA),)
CUDA_SRC := $(wildcard src/cuda/*.cu src/cudaexec/*.cu src/cudagen/*.cu)
LIB_OBJ += $(CUDA_SRC:%.cu=$(BUILD)/%.o) $(BUILD)/src/cuda/gen_text.o
endif
CLI_OBJ := $(CLI_SRC:%.c=$(BUILD)/%.o)
$(BUILD)/src/layer/backends.o: CFLAGS += -DDM_BACKEND_LIST='$(foreach b,$(BACKENDS),X($(b)))'
TEST_SRC := $(wildcard tests/test_*.c)
TEST_BIN := $(TEST_SRC:tests/%.c=$(BUILD)/tests/%)

all: $(BUILD)/dmove

$(CONFIG_STAMP):
	@mkdir -p $(dir $@) && echo "$(BUILD_CONFIG)" > $@

$(BUILD)/%.o: %.c $(wildcard include/*.h src/*/*.h src/*/*.def cli/*.h) $(CONFIG_STAMP)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c $< -o $@

$(BUILD)/%.o: %.cu $(wildcard include/*.h src/*/*.h src/*/*.def src/cuda/*.cuh) $(CONFIG_STAMP)
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) -c $< -o $@

# The headers the generated row kernels include, as C strings for NVRTC (src/cudagen/genbuild.cu).
GEN_HEADERS := src/cuda/philox.cuh src/cuda/rowcore.cuh src/cuda/genrt.cuh
$(BUILD)/src/cuda/gen_text.c: $(GEN_HEADERS) Makefile
	@mkdir -p $(dir $@)
	@{ echo '/* made by the Makefile from $(GEN_HEADERS) */'; \
	  for h in philox rowcore genrt; do \
	    echo "const char dmc_text_$$h[] ="; \
	    sed -e 's/\\/\\\\/g' -e 's/"/\\"/g' -e 's/^/"/' -e 's/$$/\\n"/' src/cuda/$$h.cuh; \
	    echo ';'; \
	  done; } > $@.tmp && mv $@.tmp $@

$(BUILD)/src/cuda/gen_text.o: $(BUILD)/src/cuda/gen_text.c
	$(CC) $(CFLAGS) -c $< -o $@

$(BUILD)/libdmove.a: $(LIB_OBJ)
	@rm -f $@
	ar rcs $@ $^

$(BUILD)/dmove: $(CLI_OBJ) $(BUILD)/libdmove.a
	$(CC) $(CFLAGS) $(CLI_OBJ) $(BUILD)/libdmove.a -o $@ $(LDLIBS)

$(BUILD)/tests/%: tests/%.c $(BUILD)/libdmove.a tests/testutil.h tests/layerutil.h tests/trainutil.h $(CONFIG_STAMP)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -Itests $< $(BUILD)/libdmove.a -o $@ $(LDLIBS)

# The main job on the embedded default (BERT-base): build and benchmark.
run: $(BUILD)/dmove
	$(BUILD)/dmove bench

test: $(BUILD)/dmove $(TEST_BIN)
	@set -e; for t in $(TEST_BIN); do echo "== $$t"; OMP_NUM_THREADS=$${OMP_NUM_THREADS:-2} $$t; done
	@set -e; for s in tests/test_*.sh; do [ -e "$$s" ] || continue; echo "== $$s"; DMOVE=$(BUILD)/dmove sh $$s; done
	@$(MAKE) --no-print-directory test-asan
	@echo "all tests passed"

# Parsers, the CLI's error paths, the contraction kernels (dmove's own GEMM; ASan does not
# see its masked vector loads and stores, which test_contract checks by poisoned columns)
# the tuner's plans (epilogue fusion included) and the trainer (its checkpoint loader) under AddressSanitizer and UBSan (CPU build: they do not touch the GPU, and ASan's shadow
# memory and the CUDA driver do not mix).
ASAN_TESTS := test_safetensors test_analysis test_contract test_tune test_train test_checkpoint
test-asan:
	@CFLAGS="-O1 -g -fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer" $(MAKE) --no-print-directory NVCC= BUILD=build-asan build-asan/dmove $(ASAN_TESTS:%=build-asan/tests/%)
	@set -e; for t in $(ASAN_TESTS); do echo "== $$t (asan)"; ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 OMP_NUM_THREADS=$${OMP_NUM_THREADS:-2} build-asan/tests/$$t; done
	@set -e; for s in tests/test_cli_errors.sh tests/test_analyze_cli.sh; do [ -e "$$s" ] || continue; echo "== $$s (asan)"; DMOVE=build-asan/dmove ASAN_OPTIONS=detect_leaks=1 sh $$s; done

clean:
	rm -rf build build-asan build-nocuda

.PHONY: all run test test-asan clean
