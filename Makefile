# ikbo-serve build. `make help` lists the targets.
#
# Outputs go to build/. CUDA sources (kernels/cuda/*.cu) are compiled whenever
# nvcc is found, for sm_90a plus PTX; `make CUDA=0` builds CPU-only.

CC       ?= gcc
CFLAGS   ?= -O2 -g
CFLAGS   += -std=gnu11 -Wall -Wextra -Werror -MMD -MP -pthread
CPPFLAGS += -I. -I$(BUILD)/gen
LDLIBS   += -lm -lpthread
BUILD    := build
PY       := /usr/bin/python3

NVCC     ?= $(shell command -v nvcc 2>/dev/null || ls /usr/local/cuda/bin/nvcc 2>/dev/null)
CUDA_SRCS := $(wildcard kernels/cuda/*.cu)
ifeq ($(strip $(NVCC)),)
CUDA ?= 0
else
CUDA ?= 1
endif
ifeq ($(strip $(CUDA_SRCS)),)
override CUDA := 0
endif
CUDA_HOME ?= $(patsubst %/bin/nvcc,%,$(NVCC))
NVCCFLAGS ?= -O3 -lineinfo
NVCCFLAGS += -MMD -MP -std=c++17 -gencode=arch=compute_90a,code=sm_90a -gencode=arch=compute_90a,code=compute_90a \
             -Xcompiler -fPIC,-Wall -I.
ifeq ($(CUDA),1)
CPPFLAGS  += -DIKBO_CUDA
CUDA_LIBS := -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 -lcublasLt -lcublas -lcudart
CUDA_OBJS := $(CUDA_SRCS:%.cu=$(BUILD)/obj/%.o)
# GPU checks and the kernel benchmark: built (not run) wherever nvcc is, run
# on a GPU machine by bench/kernels/run.sh.
GPU_BINS  := $(BUILD)/gpu/test_cuda_ops $(BUILD)/gpu/test_cuda_model $(BUILD)/gpu/bench_kernels
endif

# Debian packages: what building needs, and what the tests need on top.
DEPS_BUILD := gcc make pkg-config libevent-dev libprotobuf-c-dev protobuf-c-compiler \
              libgrpc-dev libjansson-dev
DEPS_TEST  := libcmocka-dev protobuf-compiler python3-torch python3-numpy python3-grpcio \
              python3-hpack python3-hyperframe \
              python3-protobuf python3-prometheus-client openssl curl
# deploy/ tests: balancers, linters, promtool/prometheus, systemd-analyze; kubectl from
# Debian's kubernetes-client unless one is already installed (another kubectl package
# owns /usr/bin/kubectl and the two cannot both be installed).
DEPS_TEST  += haproxy nginx yamllint prometheus systemd python3-yaml \
              $(if $(shell command -v kubectl 2>/dev/null),,kubernetes-client)

ENGINE_SRCS := $(wildcard engine/*.c) $(wildcard kernels/*.c) $(wildcard kernels/cpu/*.c)
ENGINE_OBJS := $(ENGINE_SRCS:%.c=$(BUILD)/obj/%.o)
SERVER_SRCS := $(filter-out server/main.c,$(wildcard server/*.c))
SERVER_OBJS := $(SERVER_SRCS:%.c=$(BUILD)/obj/%.o)
PROTOS      := proto/ikbo/v1/ranker.proto $(wildcard proto/grpc/health/v1/health.proto)
GEN_C       := $(PROTOS:proto/%.proto=$(BUILD)/gen/%.pb-c.c)
GEN_H       := $(GEN_C:.c=.h)
GEN_OBJS    := $(GEN_C:$(BUILD)/gen/%.c=$(BUILD)/obj/gen/%.o)
GEN_PY      := $(PROTOS:proto/%.proto=$(BUILD)/gen/py/%_pb2.py)
UNIT_SRCS   := $(wildcard tests/unit/test_*.c)
UNIT_BINS   := $(UNIT_SRCS:tests/unit/%.c=$(BUILD)/tests/%)
SERVER_LIBS := -lgrpc -lgpr -lprotobuf-c -levent -levent_pthreads -ljansson

LIBIKBO := $(BUILD)/libikbo.a

.PHONY: FORCE all run test deps deps-build unit golden integration fuzz tsan alloc-fail clean help
.DEFAULT_GOAL := all
# Keep generated headers and test objects between runs.
.SECONDARY:

all: $(BUILD)/ikbo-serve $(BUILD)/ikbo-score $(BUILD)/ikbo-loadgen $(GEN_PY) $(UNIT_BINS) $(BUILD)/fuzz_loader \
     $(BUILD)/host_path $(GPU_BINS)

help:
	@echo "make            build build/ikbo-serve, build/ikbo-score and the tests (CUDA=0: CPU only)"
	@echo "make run        install missing packages, build, serve the demo model (config/server.json)"
	@echo "make test       install missing packages, build, run unit, fuzz, golden and integration tests"
	@echo "make unit       cmocka unit tests only"
	@echo "make golden     C engine vs the PyTorch reference (tests/golden/golden.py)"
	@echo "make integration  daemon tests with real gRPC/HTTP clients (tests/integration)"
	@echo "make tsan       batcher unit tests under ThreadSanitizer (objects in build/tsan)"
	@echo "make alloc-fail out-of-memory sweeps: fail the N-th allocation, check errors and leaks"
	@echo "make deps       install missing Debian packages (needs root)"
	@echo "make clean      remove build/"

# ---- packages ----
deps-build:
	@$(MAKE) --no-print-directory -s _deps PKGS="$(DEPS_BUILD)"
deps:
	@$(MAKE) --no-print-directory -s _deps PKGS="$(DEPS_BUILD) $(DEPS_TEST)"
_deps:
	@missing=""; for p in $(PKGS); do \
	  dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "install ok installed" || missing="$$missing $$p"; \
	done; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" != 0 ]; then \
	    echo "error: missing Debian packages:$$missing"; \
	    echo "       run 'sudo make deps' or: sudo apt-get install$$missing"; exit 1; \
	  fi; \
	  echo "installing:$$missing"; \
	  export DEBIAN_FRONTEND=noninteractive; \
	  (apt-get install -y -qq $$missing >/dev/null 2>&1) || \
	  (apt-get update -qq && apt-get install -y -qq $$missing) || exit 1; \
	fi

# ---- build ----
$(BUILD)/gen/%.pb-c.c $(BUILD)/gen/%.pb-c.h: proto/%.proto
	@mkdir -p $(BUILD)/gen
	protoc-c --c_out=$(BUILD)/gen -Iproto $<

$(BUILD)/gen/py/%_pb2.py: proto/%.proto
	@mkdir -p $(BUILD)/gen/py
	protoc --python_out=$(BUILD)/gen/py -Iproto $<

$(BUILD)/obj/gen/%.o: $(BUILD)/gen/%.c $(GEN_H)
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) $(CFLAGS) -Wno-unused-parameter -c $< -o $@

# Objects depend on the flags they were built with (CUDA=0/1 changes -D).
FLAGS_STAMP := $(BUILD)/.flags
FLAGS_NOW   := $(CC) $(CPPFLAGS) $(CFLAGS) | $(NVCC) $(NVCCFLAGS) | CUDA=$(CUDA)
$(FLAGS_STAMP): FORCE
	@mkdir -p $(BUILD)
	@if [ "$$(cat $@ 2>/dev/null)" != '$(FLAGS_NOW)' ]; then echo '$(FLAGS_NOW)' > $@; fi
FORCE:

$(BUILD)/obj/%.o: %.c $(FLAGS_STAMP) | $(GEN_H)
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) $(CFLAGS) -c $< -o $@

$(BUILD)/obj/%.o: %.cu $(FLAGS_STAMP)
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) -c $< -o $@

$(LIBIKBO): $(ENGINE_OBJS) $(CUDA_OBJS)
	@rm -f $@
	ar rcs $@ $^

$(BUILD)/ikbo-serve: $(BUILD)/obj/server/main.o $(SERVER_OBJS) $(GEN_OBJS) $(LIBIKBO)
	$(CC) $(CFLAGS) -o $@ $^ $(SERVER_LIBS) $(CUDA_LIBS) $(LDLIBS) -lstdc++

$(BUILD)/ikbo-score: $(BUILD)/obj/tools/ikbo_score.o $(SERVER_OBJS) $(GEN_OBJS) $(LIBIKBO)
	$(CC) $(CFLAGS) -o $@ $^ $(SERVER_LIBS) $(CUDA_LIBS) $(LDLIBS) -lstdc++

# Load generator: a gRPC client only (no engine, no server objects).
LOADGEN_OBJS := $(patsubst %.c,$(BUILD)/obj/%.o,$(wildcard tools/loadgen/*.c))
$(BUILD)/ikbo-loadgen: $(LOADGEN_OBJS) $(BUILD)/obj/gen/ikbo/v1/ranker.pb-c.o
	$(CC) $(CFLAGS) -o $@ $^ -lgrpc -lgpr -lprotobuf-c -ljansson $(LDLIBS)

# The server's per-request CPU cost, step by step (bench/e2e/host_path.c).
$(BUILD)/host_path: $(BUILD)/obj/bench/e2e/host_path.o $(BUILD)/obj/tools/loadgen/shape.o \
                    $(SERVER_OBJS) $(GEN_OBJS) $(LIBIKBO)
	$(CC) $(CFLAGS) -o $@ $^ $(SERVER_LIBS) $(CUDA_LIBS) $(LDLIBS) -lstdc++

$(BUILD)/tests/%: $(BUILD)/obj/tests/unit/%.o $(SERVER_OBJS) $(GEN_OBJS) $(LIBIKBO)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -o $@ $^ -lcmocka $(SERVER_LIBS) $(CUDA_LIBS) $(LDLIBS) -lstdc++

$(BUILD)/fuzz_loader: $(wildcard tests/fuzz/fuzz_loader.c) $(LIBIKBO)
	@mkdir -p $(dir $@)
	@if [ -f tests/fuzz/fuzz_loader.c ]; then \
	  echo "$(CC) ... tests/fuzz/fuzz_loader.c -o $@"; \
	  $(CC) $(CPPFLAGS) $(CFLAGS) -o $@ tests/fuzz/fuzz_loader.c $(LIBIKBO) -ljansson $(CUDA_LIBS) $(LDLIBS) -lstdc++; \
	else touch $@; fi

$(BUILD)/gpu/test_cuda_ops: tests/gpu/test_cuda_ops.c $(LIBIKBO)
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) $(CFLAGS) -o $@ $< $(LIBIKBO) $(CUDA_LIBS) $(LDLIBS) -lstdc++

# jansson linked statically: the GPU machine has no jansson.
$(BUILD)/gpu/test_cuda_model: tests/gpu/test_cuda_model.c $(LIBIKBO)
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) $(CFLAGS) -o $@ $< $(LIBIKBO) -Wl,-Bstatic -ljansson -Wl,-Bdynamic \
	    $(CUDA_LIBS) $(LDLIBS) -lstdc++

$(BUILD)/gpu/bench_kernels: bench/kernels/bench_kernels.cu $(LIBIKBO)
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) -o $@ $< $(LIBIKBO) -Xlinker -rpath -Xlinker $(CUDA_HOME)/lib64 \
	    -lcublasLt -lcublas

# ---- run and test ----
run: deps-build $(BUILD)/ikbo-serve
	$(BUILD)/ikbo-serve --config config/server.json

unit: $(UNIT_BINS)
	@set -e; for t in $(UNIT_BINS); do echo "== $$t"; $$t; done

fuzz: $(BUILD)/fuzz_loader
	@if [ -s $(BUILD)/fuzz_loader ]; then echo "== fuzz_loader"; $(BUILD)/fuzz_loader; fi

golden: $(BUILD)/ikbo-score
	$(PY) tests/golden/golden.py --score-bin $(BUILD)/ikbo-score --work $(BUILD)/golden

integration: $(BUILD)/ikbo-serve $(BUILD)/ikbo-score $(BUILD)/ikbo-loadgen $(GEN_PY)
	@set -e; for t in $(sort $(wildcard tests/integration/test_*.py)); do \
	  echo "== $$t"; IKBO_BUILD=$(abspath $(BUILD)) IKBO_ROOT=$(CURDIR) $(PY) $$t; done

test: deps
	@$(MAKE) --no-print-directory all
	@$(MAKE) --no-print-directory unit
	@$(MAKE) --no-print-directory fuzz
	@$(MAKE) --no-print-directory alloc-fail
	@$(MAKE) --no-print-directory golden
	@$(MAKE) --no-print-directory integration
	@echo "make test: all passed"

# ThreadSanitizer: the batcher's unit tests with every object rebuilt under
# -fsanitize=thread in $(BUILD)/tsan (CPU only; clang when installed, else
# gcc). CFLAGS goes through the environment so the Makefile's own flags are
# still appended. Any report fails the run (halt_on_error).
TSAN_CC := $(if $(shell command -v clang 2>/dev/null),clang,gcc)
tsan:
	@env CFLAGS="-O1 -g -fsanitize=thread -fno-omit-frame-pointer" $(MAKE) --no-print-directory \
	  BUILD=$(BUILD)/tsan CUDA=0 CC=$(TSAN_CC) $(BUILD)/tsan/tests/test_batcher
	TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1" $(BUILD)/tsan/tests/test_batcher

# Out-of-memory sweeps (tests/alloc/test_alloc_fail.c): the engine and server
# objects' allocation calls are redirected with --wrap to tests/alloc/
# alloc_fail.c, which fails the N-th one and counts live blocks; libraries
# keep the real allocator (jansson and protobuf-c hand-offs: alloc_fail.h).
# AF_SITES gets the call sites reached; coverage.sh compares them with the
# allocation calls in engine/, server/ and kernels/cpu/.
AF_WRAP := malloc calloc realloc free strdup strndup posix_memalign aligned_alloc \
           protobuf_c_message_unpack protobuf_c_message_free_unpacked log_thread_name
AF_OBJS := $(BUILD)/obj/tests/alloc/test_alloc_fail.o $(BUILD)/obj/tests/alloc/alloc_fail.o
$(BUILD)/tests/alloc_fail: $(AF_OBJS) $(SERVER_OBJS) $(GEN_OBJS) $(LIBIKBO)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(foreach f,$(AF_WRAP),-Wl,--wrap=$(f)) -o $@ $^ $(SERVER_LIBS) $(CUDA_LIBS) \
	    $(LDLIBS) -ldl -lstdc++

alloc-fail: $(BUILD)/tests/alloc_fail
	AF_SITES=$(BUILD)/alloc_fail_sites.txt $(BUILD)/tests/alloc_fail
	@tests/alloc/coverage.sh $(BUILD)/alloc_fail_sites.txt

clean:
	rm -rf $(BUILD)

-include $(shell find $(BUILD)/obj -name '*.d' 2>/dev/null)
