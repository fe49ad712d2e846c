# dmove build. `make` builds libdmove.a and the dmove command; `make test` runs every test.
# Probes print what they found (BLAS, OpenMP, cJSON, nvcc).

CC      ?= cc
BUILD   ?= build
# CUDA=0: the CPU backend alone; CUDA=1: the CUDA backend too, an error when nvcc or cuBLAS
# is not found; CUDA=auto (the default): the CUDA backend when they are found. `NVCC=`
# (empty) is the same as CUDA=0.
CUDA    ?= auto
# MPI=0: one process (a launch by mpirun refused, saying so); MPI=1: data parallelism over
# MPI, an error when mpicc (Open MPI, MPICH) is not found; MPI=auto (the default): with MPI
# when mpicc is found.
MPI     ?= auto
comma   := ,

# --- probes ---------------------------------------------------------------------------
# The compiler's Debian multiarch triplet (x86_64-linux-gnu, aarch64-linux-gnu,
# powerpc64le-linux-gnu, ...): where Debian puts the libraries for that architecture.
MULTIARCH := $(or $(shell $(CC) -print-multiarch 2>/dev/null),$(shell $(CC) -dumpmachine 2>/dev/null))
# -march=native where the compiler takes it (x86, arm64), else -mcpu=native (ppc64el, ...),
# else neither; only when CFLAGS is not given.
ifeq ($(origin CFLAGS),undefined)
NATIVE_FLAG := $(firstword $(foreach f,-march=native -mcpu=native,$(shell $(CC) $(f) -Werror -S -x c /dev/null -o /dev/null >/dev/null 2>&1 && echo $(f))))
CFLAGS  := -O3 $(NATIVE_FLAG) -g
NATIVE_WHY := $(or $(NATIVE_FLAG),neither -march=native nor -mcpu=native taken by $(CC))
else
NATIVE_WHY := CFLAGS given
endif
CFLAGS  += -fPIC -fno-semantic-interposition -std=c11 -D_GNU_SOURCE -fno-trapping-math -fno-math-errno -Wall -Wextra -Wno-unused-parameter -Wno-format-truncation -fopenmp -Iinclude -Isrc
LDLIBS  += -lm
PKG_CONFIG ?= pkg-config
HAVE_PKG_CONFIG := $(shell command -v $(PKG_CONFIG) 2>/dev/null)
# $(call pc,ARGS): pkg-config's answer, empty when there is no pkg-config or no such package.
# The OpenMP build's own .pc directory comes first, so `openblas` is that build even when
# Debian's alternatives point openblas.pc at another one.
BLAS_PC_DIR := $(wildcard /usr/lib/$(MULTIARCH)/openblas-openmp/pkgconfig)
pc = $(if $(HAVE_PKG_CONFIG),$(shell PKG_CONFIG_PATH=$(BLAS_PC_DIR)$${PKG_CONFIG_PATH:+:$$PKG_CONFIG_PATH} $(PKG_CONFIG) $(1) 2>/dev/null))

# BLAS: OpenBLAS (dmove calls openblas_set_num_threads), its OpenMP build preferred: it shares
# dmove's OpenMP threads. Through pkg-config (openblas, openblas-openmp; not blas-openblas,
# whose -lblas lacks the openblas_* calls), else the usual paths; or give BLAS_CFLAGS and
# BLAS_LIBS.
ifeq ($(origin BLAS_LIBS),undefined)
BLAS_PKG := $(firstword $(foreach p,openblas openblas-openmp,$(if $(call pc,--exists $(p) && echo y),$(p))))
ifneq ($(BLAS_PKG),)
BLAS_CFLAGS := $(call pc,--cflags $(BLAS_PKG))
BLAS_LIBDIR := $(call pc,--variable=libdir $(BLAS_PKG))
BLAS_LIBS   := $(call pc,--libs $(BLAS_PKG)) $(if $(BLAS_LIBDIR),-Wl$(comma)-rpath$(comma)$(BLAS_LIBDIR))
BLAS_WHERE  := pkg-config $(BLAS_PKG): $(or $(BLAS_LIBDIR),$(BLAS_LIBS))
else
BLAS_INC := $(dir $(firstword $(wildcard $(foreach d,/usr/include/$(MULTIARCH)/openblas-openmp /usr/include/openblas /usr/include/$(MULTIARCH) /usr/include /usr/local/include,$(d)/cblas.h))))
BLAS_LIB := $(firstword $(wildcard $(foreach d,/usr/lib/$(MULTIARCH)/openblas-openmp /usr/lib/$(MULTIARCH) /usr/lib64 /usr/lib /usr/local/lib,$(d)/libopenblas.so)))
ifeq ($(BLAS_LIB),)
$(error BLAS not found (no pkg-config openblas, no libopenblas.so under /usr/lib/$(MULTIARCH), /usr/lib64, /usr/lib, /usr/local/lib): install the OpenMP build of OpenBLAS: apt-get install libopenblas-openmp-dev pkg-config)
endif
BLAS_LIBDIR := $(dir $(BLAS_LIB))
BLAS_CFLAGS := $(if $(BLAS_INC),-I$(BLAS_INC))
BLAS_LIBS   := -L$(BLAS_LIBDIR) -Wl,-rpath,$(BLAS_LIBDIR) -lopenblas
BLAS_WHERE  := $(BLAS_LIB)
endif
else
BLAS_WHERE  := BLAS_LIBS=$(BLAS_LIBS)
endif
BLAS_KIND := $(if $(findstring openmp,$(BLAS_LIBS)),OpenBLAS$(comma) OpenMP build,OpenBLAS; the OpenMP build is preferred: apt-get install libopenblas-openmp-dev)
CFLAGS += $(BLAS_CFLAGS)
LDLIBS += $(BLAS_LIBS)

# cJSON: pkg-config libcjson, else /usr/include/cjson or /usr/local/include/cjson.
ifneq ($(call pc,--exists libcjson && echo y),)
CJSON_CFLAGS := $(call pc,--cflags libcjson)
CJSON_LIBS   := $(call pc,--libs libcjson)
CJSON_WHERE  := pkg-config libcjson: $(strip $(CJSON_CFLAGS) $(CJSON_LIBS))
else
CJSON_H := $(firstword $(wildcard /usr/include/cjson/cJSON.h /usr/local/include/cjson/cJSON.h))
ifeq ($(CJSON_H),)
$(error cJSON not found: apt-get install libcjson-dev)
endif
CJSON_CFLAGS := $(if $(filter /usr/local/%,$(CJSON_H)),-I/usr/local/include)
CJSON_LIBS   := $(if $(filter /usr/local/%,$(CJSON_H)),-L/usr/local/lib -Wl$(comma)-rpath$(comma)/usr/local/lib) -lcjson
CJSON_WHERE  := $(dir $(CJSON_H))
endif
CFLAGS += $(CJSON_CFLAGS)
LDLIBS += $(CJSON_LIBS)

# expat: only the tests use it (they parse the SVG charts: tests/test_analysis.c,
# tests/test_train.c), so only the test binaries link it and only they stop without it.
EXPAT_H ?= /usr/include/expat.h
ifneq ($(call pc,--exists expat && echo y),)
TEST_CFLAGS := $(call pc,--cflags expat)
TEST_LDLIBS := $(call pc,--libs expat)
EXPAT_WHERE := pkg-config expat (tests only)
else ifneq ($(wildcard $(EXPAT_H)),)
TEST_LDLIBS := -lexpat
EXPAT_WHERE := $(EXPAT_H) (tests only)
else
EXPAT_MISSING := expat not found: the tests need it (apt-get install libexpat1-dev); make builds dmove without it
EXPAT_WHERE := not found (tests only: apt-get install libexpat1-dev)
endif

# CUDA backend (src/cuda, src/cudagen, src/cudaexec): built when nvcc is found, on PATH or
# as /usr/local/cuda/bin/nvcc, with cuBLAS beside it. `make CUDA=0 BUILD=build-cpu` (or
# `make NVCC= BUILD=build-nocuda`) builds the CPU backend alone (a build folder remembers
# its CUDA setting in config.stamp and rebuilds when it changes).
HAVE_CUDA :=
# The backends built (src/plan/backend.h), registered by src/layer/backends.c: a backend is
# its folder and a line here.
BACKENDS := cpu
ifeq ($(CUDA),0)
CUDA_WHY := CUDA=0 given: CPU backend only
else
NVCC ?= $(or $(shell command -v nvcc 2>/dev/null),$(wildcard /usr/local/cuda/bin/nvcc))
ifeq ($(NVCC),)
ifeq ($(origin NVCC),command line)
CUDA_WHY := NVCC= given: CPU backend only
else
CUDA_WHY := nvcc not found (not on PATH, no /usr/local/cuda/bin/nvcc): CPU backend only
endif
else
CUDA_HOME ?= $(patsubst %/bin/nvcc,%,$(realpath $(NVCC)))
# the toolkit's library folder for this architecture: lib64, targets/<arch>-linux/lib (the
# toolkit's names: x86_64, sbsa or aarch64 for arm64, ppc64le), or Debian's lib/<multiarch>
CUDA_TARGET_ARCH := $(patsubst aarch64,sbsa aarch64,$(patsubst powerpc64le,ppc64le,$(firstword $(subst -, ,$(MULTIARCH)))))
CUDA_LIBDIR := $(dir $(firstword $(wildcard $(CUDA_HOME)/lib64/libcublas.so $(CUDA_TARGET_ARCH:%=$(CUDA_HOME)/targets/%-linux/lib/libcublas.so) $(CUDA_HOME)/lib/$(MULTIARCH)/libcublas.so)))
ifeq ($(CUDA_LIBDIR),)
CUDA_WHY := $(NVCC) found, but no libcublas.so under $(CUDA_HOME): CPU backend only
else
HAVE_CUDA := 1
BACKENDS += cuda
NVCC_VERSION := $(shell $(NVCC) --version 2>/dev/null | sed -n 's/.*release \([0-9.]*\).*/\1/p')
# sm_80 (A100), sm_90 (H100/H200), and compute_90 PTX that newer GPUs compile at load time
NVCC_ARCH ?= -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=sm_90 -gencode arch=compute_90,code=compute_90
NVCCFLAGS ?= -O3 -lineinfo
NVCCFLAGS += -std=c++17 $(NVCC_ARCH) -Xcompiler -fPIC,-fno-semantic-interposition,-fopenmp,-Wall,-Wextra,-Wno-unused-parameter -Iinclude -Isrc -DDM_HAVE_CUDA
# NVCC_EXTRA: flags added to nvcc's, e.g. the flash kernels' variants (bench/gpu/variants.sh)
NVCCFLAGS += $(NVCC_EXTRA)
CFLAGS += -DDM_HAVE_CUDA
# NVRTC compiles the row kernels generated per fused group (src/cudagen/) at run time,
# with the toolkit's headers; the tests build the same code for the host with $(CXX)
CXX ?= c++
NVCCFLAGS += -DDM_CUDA_INCLUDE='"$(CUDA_HOME)/include"' -DDM_HOST_CXX='"$(CXX)"'
LDLIBS += -L$(CUDA_LIBDIR) -Wl,-rpath,$(CUDA_LIBDIR) -lcublasLt -lcublas -lnvrtc -lcudart -ldl -lstdc++
CUDA_WHY := $(NVCC) (release $(NVCC_VERSION)), cuBLAS in $(CUDA_LIBDIR): CUDA backend built (sm_80, sm_90)
endif
endif
endif
ifeq ($(CUDA)$(HAVE_CUDA),1)
$(error CUDA=1 given, but: $(CUDA_WHY))
endif

# MPI (src/dist): the compile and link flags mpicc gives (Open MPI's --showme, MPICH's
# -compile-info/-link-info), so that the library is built by $(CC) as the rest.
HAVE_MPI :=
ifeq ($(MPI),0)
MPI_WHY := MPI=0 given: one process per run
else
MPICC ?= $(shell command -v mpicc 2>/dev/null)
MPI_CFLAGS := $(if $(MPICC),$(or $(shell $(MPICC) --showme:compile 2>/dev/null),$(filter -I% -D%,$(shell $(MPICC) -compile-info 2>/dev/null))))
MPI_LIBS := $(if $(MPICC),$(or $(shell $(MPICC) --showme:link 2>/dev/null),$(filter -L% -l% -Wl%,$(shell $(MPICC) -link-info 2>/dev/null))))
ifeq ($(MPI_LIBS),)
MPI_WHY := no mpicc found (apt-get install libopenmpi-dev openmpi-bin): one process per run
else
HAVE_MPI := 1
LDLIBS += $(MPI_LIBS)
MPI_WHY := $(MPICC) ($(firstword $(MPI_LIBS) )...): data parallelism over MPI built
endif
endif
ifeq ($(MPI)$(HAVE_MPI),1)
$(error MPI=1 given, but: $(MPI_WHY))
endif
# NCCL (the CUDA backend's sums over several GPUs): nccl.h and libnccl.so beside the
# toolkit or in the system's paths; NCCL=0 leaves it out.
NCCL ?= auto
HAVE_NCCL :=
ifneq ($(HAVE_CUDA),)
ifneq ($(NCCL),0)
NCCL_H := $(firstword $(wildcard $(CUDA_HOME)/include/nccl.h /usr/include/nccl.h /usr/local/include/nccl.h))
NCCL_LIB := $(firstword $(wildcard $(CUDA_LIBDIR)libnccl.so /usr/lib/$(MULTIARCH)/libnccl.so /usr/local/lib/libnccl.so))
ifneq ($(and $(NCCL_H),$(NCCL_LIB)),)
HAVE_NCCL := 1
NVCCFLAGS += -DDM_HAVE_NCCL -I$(dir $(NCCL_H))
LDLIBS += -L$(dir $(NCCL_LIB)) -Wl,-rpath,$(dir $(NCCL_LIB)) -lnccl
MPI_WHY := $(MPI_WHY); NCCL $(NCCL_LIB) for the GPUs
else
MPI_WHY := $(MPI_WHY); no NCCL (nccl.h, libnccl.so): one GPU per run
endif
endif
endif

$(info dmove build: BLAS  $(BLAS_WHERE) ($(BLAS_KIND)))
$(info dmove build: cJSON $(CJSON_WHERE))
$(info dmove build: expat $(EXPAT_WHERE))
$(info dmove build: OpenMP via -fopenmp ($(CC)); target $(MULTIARCH), $(NATIVE_WHY))
$(info dmove build: CUDA  $(CUDA_WHY))
$(info dmove build: MPI   $(MPI_WHY))

# Objects differ with and without CUDA (DM_HAVE_CUDA), MPI and NCCL, and were not built
# position-independent (pic, for libdmove.so) before: a change of setting rebuilds.
# (Not touched by a dry run, make -n.)
CONFIG_STAMP := $(BUILD)/config.stamp
BUILD_CONFIG := cuda=$(HAVE_CUDA) nvcc=$(if $(HAVE_CUDA),$(NVCC)) mpi=$(HAVE_MPI) nccl=$(HAVE_NCCL) pic=1
ifeq ($(findstring n,$(firstword -$(MAKEFLAGS))),)
$(shell mkdir -p $(BUILD) && { [ "$$(cat $(CONFIG_STAMP) 2>/dev/null)" = "$(BUILD_CONFIG)" ] || echo "$(BUILD_CONFIG)" > $(CONFIG_STAMP); })
endif

# --- sources ----------------------------------------------------------------------------
LIB_SRC := $(wildcard src/core/*.c src/text/*.c src/graph/*.c src/analysis/*.c src/plan/*.c src/tune/*.c src/train/*.c src/cpu/*.c src/layer/*.c src/dist/*.c)
CLI_SRC := $(wildcard cli/*.c)
LIB_OBJ := $(LIB_SRC:%.c=$(BUILD)/%.o)
ifneq ($(HAVE_CUDA),)
CUDA_SRC := $(wildcard src/cuda/*.cu src/cudaexec/*.cu src/cudagen/*.cu)
LIB_OBJ += $(CUDA_SRC:%.cu=$(BUILD)/%.o) $(BUILD)/src/cuda/gen_text.o
endif
CLI_OBJ := $(CLI_SRC:%.c=$(BUILD)/%.o)
# only src/dist sees MPI's headers
$(BUILD)/src/dist/%.o: CFLAGS += $(if $(HAVE_MPI),-DDM_HAVE_MPI $(MPI_CFLAGS)) $(if $(HAVE_NCCL),-DDM_HAVE_NCCL)
$(BUILD)/src/layer/backends.o: CFLAGS += -DDM_BACKEND_LIST='$(foreach b,$(BACKENDS),X($(b)))'
# the direct kernel's AVX2 variant is built without AVX-512 where the compiler can say so,
# so that it is the code an AVX2-only machine runs (16 vector registers, not AVX-512VL's 32)
# on an AVX-512 machine too: DMOVE_ISA=avx2 then times what the smaller machine would
NO_AVX512_FLAG := $(shell $(CC) -mno-avx512f -Werror -S -x c /dev/null -o /dev/null >/dev/null 2>&1 && echo -mno-avx512f)
$(BUILD)/src/cpu/direct_avx2.o: CFLAGS += $(NO_AVX512_FLAG)
TEST_SRC := $(wildcard tests/test_*.c)
TEST_BIN := $(TEST_SRC:tests/%.c=$(BUILD)/tests/%)

all: $(BUILD)/dmove

$(CONFIG_STAMP):
	@mkdir -p $(dir $@) && echo "$(BUILD_CONFIG)" > $@

$(BUILD)/%.o: %.c $(wildcard include/*.h src/*.h src/*/*.h src/*/*.def cli/*.h) $(CONFIG_STAMP)
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

# The shared library the Python package loads with ctypes (python/dmove/_lib.py): the same
# objects as libdmove.a (every object is compiled -fPIC).
$(BUILD)/libdmove.so: $(LIB_OBJ)
	$(CC) $(CFLAGS) -shared $(LIB_OBJ) -o $@ $(LDLIBS)

# `make python`: libdmove.so, copied into python/dmove/ so that `pip install ./python`
# installs it with the package (python/setup.py takes DMOVE_LIB, a path to another build's
# libdmove.so, first).
python: $(BUILD)/libdmove.so $(BUILD)/dmove
	cp $(BUILD)/libdmove.so python/dmove/libdmove.so
	mkdir -p python/dmove/bin && cp $(BUILD)/dmove python/dmove/bin/dmove
	@echo "now: pip install ./python  (in a virtual environment with torch and transformers)"

$(BUILD)/tests/%: tests/%.c $(BUILD)/libdmove.a tests/testutil.h tests/layerutil.h tests/trainutil.h $(CONFIG_STAMP)
ifneq ($(EXPAT_MISSING),)
	$(error $(EXPAT_MISSING))
endif
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(TEST_CFLAGS) -Itests $< $(BUILD)/libdmove.a -o $@ $(LDLIBS) $(TEST_LDLIBS)

# test_tools makes allocations fail on demand (the API's error paths): the C library's
# allocators wrapped, the library's calls to them included.
$(BUILD)/tests/test_tools: TEST_LDLIBS += -Wl,--wrap=malloc,--wrap=calloc,--wrap=realloc,--wrap=strdup

# The main job on the embedded default (BERT-base): build and benchmark.
run: $(BUILD)/dmove
	$(BUILD)/dmove bench

# Each test's output is kept in $(BUILD)/test-logs/ as well; the suite ends with what it
# skipped and why (the SKIP lines: no AVX2, no GPU, a backend not built). The layer and tuner
# tests run again with the direct kernel narrowed (DMOVE_ISA=avx512: its AVX-512 variant
# alone, on an AMX machine; =avx2: its AVX2 variant, on an AVX-512 one) and turned off
# (=none: the BLAS paths a default plan takes on CPUs without it).
test: $(BUILD)/dmove $(BUILD)/libdmove.so $(TEST_BIN)
	@sh tests/check_layers.sh && sh tests/check_funcs.sh && sh tests/check_spills.sh '$(CC)' '$(BLAS_CFLAGS)'
	@rm -rf $(BUILD)/test-logs && mkdir -p $(BUILD)/test-logs
	@set -e; for t in $(TEST_BIN); do echo "== $$t"; l=$(BUILD)/test-logs/$$(basename $$t).log; t0=$$(date +%s); \
	  OMP_NUM_THREADS=$${OMP_NUM_THREADS:-2} $$t >$$l 2>&1 && rc=0 || rc=$$?; cat $$l; echo "($$(( $$(date +%s) - t0 )) s)"; [ $$rc = 0 ]; done
	@set -e; for s in tests/test_*.sh; do [ -e "$$s" ] || continue; echo "== $$s"; l=$(BUILD)/test-logs/$$(basename $$s).log; t0=$$(date +%s); \
	  DMOVE=$(BUILD)/dmove DMOVE_LIB=$(BUILD)/libdmove.so sh $$s >$$l 2>&1 && rc=0 || rc=$$?; cat $$l; echo "($$(( $$(date +%s) - t0 )) s)"; [ $$rc = 0 ]; done
	@set -e; for isa in avx512 avx2 none; do for t in test_layer_ref test_tune test_unpad; do \
	  echo "== $(BUILD)/tests/$$t with DMOVE_ISA=$$isa"; l=$(BUILD)/test-logs/$$t-isa-$$isa.log; \
	  t0=$$(date +%s); DMOVE_ISA=$$isa OMP_NUM_THREADS=$${OMP_NUM_THREADS:-2} $(BUILD)/tests/$$t >$$l 2>&1 && rc=0 || rc=$$?; \
	  cat $$l; echo "($$(( $$(date +%s) - t0 )) s)"; [ $$rc = 0 ]; done; done
	@$(MAKE) --no-print-directory test-asan
	@sh tests/skips.sh $(BUILD)/test-logs
	@echo "all tests passed"

# Parsers, the CLI's error paths, the contraction kernels (dmove's own GEMM; ASan does not
# see its masked vector loads and stores, which test_contract checks by poisoned columns)
# the tuner's plans (epilogue fusion included) and the trainer (its checkpoint loader) under AddressSanitizer and UBSan (CPU build: they do not touch the GPU, and ASan's shadow
# memory and the CUDA driver do not mix), without MPI (Open MPI's own allocations would show
# as leaks; test_dist_cli.sh then checks that a launch of several ranks is refused).
ASAN_TESTS := test_safetensors test_files test_embed test_analysis test_contract test_tune test_train test_optim test_checkpoint test_hf test_tools test_text test_data test_model test_unpad
test-asan:
	@CFLAGS="-O1 -g -fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer" $(MAKE) --no-print-directory CUDA=0 MPI=0 BUILD=build-asan build-asan/dmove $(ASAN_TESTS:%=build-asan/tests/%)
	@set -e; for t in $(ASAN_TESTS); do echo "== $$t (asan)"; t0=$$(date +%s); ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 OMP_NUM_THREADS=$${OMP_NUM_THREADS:-2} build-asan/tests/$$t; echo "($$(( $$(date +%s) - t0 )) s)"; done
	@set -e; for s in tests/test_cli_errors.sh tests/test_analyze_cli.sh tests/test_tokenize_cli.sh tests/test_prepare_cli.sh tests/test_pretrain_cli.sh tests/test_embed_cli.sh tests/test_finetune_cli.sh tests/test_dist_cli.sh; do [ -e "$$s" ] || continue; echo "== $$s (asan)"; t0=$$(date +%s); DMOVE=build-asan/dmove ASAN_OPTIONS=detect_leaks=1 sh $$s; echo "($$(( $$(date +%s) - t0 )) s)"; done

# Fuzzing (tests/fuzz): a libFuzzer harness for each parser of untrusted files, built with
# clang under ASan and UBSan against the library's sources (CPU only, build-fuzz; the
# checkpoint, plan and shard loaders skip their checksum comparison there,
# FUZZING_BUILD_MODE_UNSAFE_FOR_PRODUCTION), each run for FUZZ_SECONDS from its seed corpus
# (tests/fuzz/corpus/NAME; what it finds new goes to build-fuzz/corpus/NAME, a crash to
# build-fuzz/artifacts/; it prints executions, cov and ft per harness). Needs clang and
# libFuzzer (apt-get install clang libomp-dev).
# FUZZ=NAME runs one harness; FUZZ_JOBS=2 two at a time (tests/fuzz/run.sh).
FUZZ_SECONDS ?= 60
FUZZ_JOBS ?= 1
FUZZ_CC ?= clang
FUZZ_NAMES := $(patsubst tests/fuzz/fuzz_%.c,%,$(wildcard tests/fuzz/fuzz_*.c))
FUZZ ?= $(FUZZ_NAMES)
FUZZ_FLAGS := -O1 -g -Wno-unknown-warning-option -fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer -DFUZZING_BUILD_MODE_UNSAFE_FOR_PRODUCTION

$(BUILD)/fuzz/fuzz_%: tests/fuzz/fuzz_%.c tests/fuzz/fuzz_util.h $(BUILD)/libdmove.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -fsanitize=fuzzer -Itests/fuzz $< $(BUILD)/libdmove.a -o $@ $(LDLIBS)

fuzz-build:
	@CFLAGS="$(FUZZ_FLAGS)" $(MAKE) --no-print-directory CC=$(FUZZ_CC) CUDA=0 BUILD=build-fuzz $(FUZZ:%=build-fuzz/fuzz/fuzz_%)

fuzz: fuzz-build
	@sh tests/fuzz/run.sh $(FUZZ_SECONDS) $(FUZZ_JOBS) $(FUZZ)

# A long run of `dmove train` interrupted by signals and resumed (tests/soak.sh; not part
# of make test: minutes): bit-identical to an uninterrupted run, RSS flat, ASan leak-clean.
soak: $(BUILD)/dmove
	@sh tests/soak.sh $(BUILD)/dmove

# Source checks (tests/): folders include one way (the level table in check_layers.sh),
# no function in src/ or cli/ over 150 lines; the direct GEMM kernel's micro-tiles, compiled
# for this CPU and for AVX2-only and Intel AVX-512 ones, spill no vector register in their
# inner loops (check_spills.sh).
check-layers:
	@sh tests/check_layers.sh

check-funcs:
	@sh tests/check_funcs.sh

check-spills:
	@sh tests/check_spills.sh '$(CC)' '$(BLAS_CFLAGS)'

clean:
	rm -rf build build-asan build-nocuda build-cpu build-fuzz

.PHONY: all python run test test-asan fuzz fuzz-build soak check-layers check-funcs check-spills clean
