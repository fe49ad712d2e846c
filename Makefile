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
NVCC := $(shell command -v nvcc 2>/dev/null)

$(info dmove build: BLAS  $(BLAS_LIB) (OpenBLAS, OpenMP build))
$(info dmove build: cJSON /usr/include/cjson)
$(info dmove build: expat /usr/include/expat.h (SVG test))
$(info dmove build: OpenMP via -fopenmp ($(CC)))
$(info dmove build: CUDA  $(if $(NVCC),$(NVCC) found (CUDA backend: see issue 5),not found: CPU backend only))

# --- sources ----------------------------------------------------------------------------
LIB_SRC := $(wildcard src/core/*.c src/graph/*.c src/analysis/*.c src/plan/*.c src/tune/*.c src/cpu/*.c src/*.c)
CLI_SRC := $(wildcard cli/*.c)
LIB_OBJ := $(LIB_SRC:%.c=$(BUILD)/%.o)
CLI_OBJ := $(CLI_SRC:%.c=$(BUILD)/%.o)
TEST_SRC := $(wildcard tests/test_*.c)
TEST_BIN := $(TEST_SRC:tests/%.c=$(BUILD)/tests/%)

all: $(BUILD)/dmove

$(BUILD)/%.o: %.c $(wildcard include/*.h src/*/*.h src/*/*.def)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c $< -o $@

$(BUILD)/libdmove.a: $(LIB_OBJ)
	@rm -f $@
	ar rcs $@ $^

$(BUILD)/dmove: $(CLI_OBJ) $(BUILD)/libdmove.a
	$(CC) $(CFLAGS) $(CLI_OBJ) $(BUILD)/libdmove.a -o $@ $(LDLIBS)

$(BUILD)/tests/%: tests/%.c $(BUILD)/libdmove.a tests/testutil.h
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

# Parsers and the CLI's error paths under AddressSanitizer and UBSan.
test-asan:
	@CFLAGS="-O1 -g -fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer" $(MAKE) --no-print-directory BUILD=build-asan build-asan/dmove build-asan/tests/test_safetensors build-asan/tests/test_analysis
	ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 build-asan/tests/test_safetensors
	ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 build-asan/tests/test_analysis
	@set -e; for s in tests/test_cli_errors.sh tests/test_analyze_cli.sh; do [ -e "$$s" ] || continue; echo "== $$s (asan)"; DMOVE=build-asan/dmove ASAN_OPTIONS=detect_leaks=1 sh $$s; done

clean:
	rm -rf build build-asan

.PHONY: all run test test-asan clean
