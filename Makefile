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
GPU_BINS  := $(BUILD)/gpu/test_cuda_ops $(BUILD)/gpu/test_cuda_model $(BUILD)/gpu/bench_kernels \
             $(BUILD)/gpu/bench_ops $(BUILD)/gpu/write_patterns $(BUILD)/gpu/test_cuda_lost \
             $(BUILD)/gpu/fmlp_proto
endif

# Debian packages: what building needs, and what the tests need on top.
DEPS_BUILD := gcc make pkg-config libevent-dev libprotobuf-c-dev protobuf-c-compiler \
              libgrpc-dev libjansson-dev
DEPS_TEST  := libcmocka-dev protobuf-compiler python3-torch python3-numpy python3-grpcio \
              python3-hpack python3-hyperframe \
              python3-protobuf python3-prometheus-client openssl curl
# fuzz: clang, and libclang-rt-14-dev for its libFuzzer/ASan/UBSan runtimes
# (bookworm's clang only recommends it).
DEPS_TEST  += clang libclang-rt-14-dev
# deploy/ tests: balancers, linters, promtool/prometheus, systemd-analyze; kubectl from
# Debian's kubernetes-client unless one is already installed (another kubectl package
# owns /usr/bin/kubectl and the two cannot both be installed).
DEPS_TEST  += haproxy nginx yamllint prometheus systemd python3-yaml \
              $(if $(shell command -v kubectl 2>/dev/null),,kubernetes-client)

ENGINE_SRCS := $(wildcard engine/*.c) $(wildcard engine/ops/*.c) $(wildcard kernels/*.c) $(wildcard kernels/cpu/*.c)
ENGINE_OBJS := $(ENGINE_SRCS:%.c=$(BUILD)/obj/%.o)
SERVER_SRCS := $(filter-out server/main.c,$(wildcard server/*.c))
SERVER_OBJS := $(SERVER_SRCS:%.c=$(BUILD)/obj/%.o)
# The server by layer: its transports (gRPC core, libevent) and the rest,
# which needs neither library. The rest is an archive, so a binary gets only
# the objects it calls into (ikbo-score: the request path; the unit tests:
# their subject) and only the libraries of its layers.
SERVER_TRANSPORT_SRCS := server/grpc_server.c server/grpc_call.c server/grpc_args.c server/http.c \
                         server/http_chunked.c
SERVER_TRANSPORT_OBJS := $(SERVER_TRANSPORT_SRCS:%.c=$(BUILD)/obj/%.o)
SERVER_CORE_OBJS := $(filter-out $(SERVER_TRANSPORT_OBJS),$(SERVER_OBJS))
PROTOS      := proto/ikbo/v1/ranker.proto $(wildcard proto/grpc/health/v1/health.proto)
GEN_C       := $(PROTOS:proto/%.proto=$(BUILD)/gen/%.pb-c.c)
GEN_H       := $(GEN_C:.c=.h)
GEN_OBJS    := $(GEN_C:$(BUILD)/gen/%.c=$(BUILD)/obj/gen/%.o)
GEN_PY      := $(PROTOS:proto/%.proto=$(BUILD)/gen/py/%_pb2.py)
UNIT_SRCS   := $(wildcard tests/unit/test_*.c)
UNIT_BINS   := $(UNIT_SRCS:tests/unit/%.c=$(BUILD)/tests/%)
CORE_LIBS      := -lprotobuf-c -ljansson
TRANSPORT_LIBS := -lgrpc -lgpr -levent -levent_pthreads
SERVER_LIBS    := $(TRANSPORT_LIBS) $(CORE_LIBS)

LIBIKBO   := $(BUILD)/libikbo.a
LIBSERVER := $(BUILD)/libikbo_server.a
# What links the engine and the server core (no transport).
CORE_LINK  = $(LIBSERVER) $(LIBIKBO) $(CORE_LIBS) $(CUDA_LIBS) $(LDLIBS) -lstdc++

.PHONY: FORCE all run test deps deps-build unit check-layers golden integration fuzz fuzz-long _fuzz_libfuzzer tsan alloc-fail clean help nvcc-flags
.DEFAULT_GOAL := all
# Keep generated headers and test objects between runs.
.SECONDARY:

all: $(BUILD)/ikbo-serve $(BUILD)/ikbo-score $(BUILD)/ikbo-plan $(BUILD)/ikbo-loadgen $(GEN_PY) $(UNIT_BINS) $(FUZZ_BINS) \
     $(BUILD)/host_path $(BUILD)/echo_server $(GPU_BINS)

help:
	@echo "make            build build/ikbo-serve, build/ikbo-score and the tests (CUDA=0: CPU only)"
	@echo "make run        install missing packages, build, serve the demo model (config/server.json)"
	@echo "make test       install missing packages, build, run unit, fuzz, golden and integration tests"
	@echo "make unit       cmocka unit tests only"
	@echo "make check-layers  fail if build/ikbo-score needs gRPC or libevent (readelf -d)"
	@echo "make golden     C engine vs the PyTorch reference (tests/golden/golden.py, test_plain_models.py, test_importer.py, golden_auto.py)"
	@echo "make integration  daemon tests with real gRPC/HTTP clients (tests/integration)"
	@echo "make fuzz       fuzz targets: standalone loops, then libFuzzer FUZZ_SECONDS=20 each"
	@echo "make fuzz-long  libFuzzer only, FUZZ_SECONDS=3600 per target (tests/fuzz)"
	@echo "make tsan       batcher unit tests under ThreadSanitizer (objects in build/tsan)"
	@echo "make nvcc-flags  print the flags a CUDA source is compiled with (bench/kernels/spills.sh uses them)"
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

# The flags a CUDA source is compiled with, for tools that compile one
# themselves (bench/kernels/spills.sh), less the dependency-file ones.
nvcc-flags:
	@echo $(filter-out -MMD -MP,$(NVCCFLAGS))

$(LIBIKBO): $(ENGINE_OBJS) $(CUDA_OBJS)
	@rm -f $@
	ar rcs $@ $^

$(LIBSERVER): $(SERVER_CORE_OBJS) $(GEN_OBJS)
	@rm -f $@
	ar rcs $@ $^

$(BUILD)/ikbo-serve: $(BUILD)/obj/server/main.o $(SERVER_TRANSPORT_OBJS) $(LIBSERVER) $(LIBIKBO)
	$(CC) $(CFLAGS) -o $@ $(filter %.o,$^) $(LIBSERVER) $(LIBIKBO) $(SERVER_LIBS) $(CUDA_LIBS) \
	    $(LDLIBS) -lstdc++

# Offline scoring: engine and request path only, no gRPC, no libevent
# (`make check-layers` checks the result).
$(BUILD)/ikbo-score: $(BUILD)/obj/tools/ikbo_score.o $(LIBSERVER) $(LIBIKBO)
	$(CC) $(CFLAGS) -o $@ $(filter %.o,$^) $(CORE_LINK)

# The plan report of a model directory: the engine only.
$(BUILD)/ikbo-plan: $(BUILD)/obj/tools/ikbo_plan.o $(LIBIKBO)
	$(CC) $(CFLAGS) -o $@ $(filter %.o,$^) $(LIBIKBO) -ljansson $(CUDA_LIBS) $(LDLIBS) -lstdc++

# Load generator: a gRPC client only (no engine, no server objects).
LOADGEN_OBJS := $(patsubst %.c,$(BUILD)/obj/%.o,$(wildcard tools/loadgen/*.c))
$(BUILD)/ikbo-loadgen: $(LOADGEN_OBJS) $(BUILD)/obj/gen/ikbo/v1/ranker.pb-c.o
	$(CC) $(CFLAGS) -o $@ $^ -lgrpc -lgpr -lprotobuf-c -ljansson $(LDLIBS)

# The server's per-request CPU cost, step by step (bench/e2e/host_path.c).
$(BUILD)/host_path: $(BUILD)/obj/bench/e2e/host_path.o $(BUILD)/obj/tools/loadgen/shape.o \
                    $(BUILD)/obj/tools/loadgen/packed.o $(LIBSERVER) $(LIBIKBO)
	$(CC) $(CFLAGS) -o $@ $(filter %.o,$^) $(CORE_LINK)

# The transport floor bench/e2e/run.sh compares ikbo-serve with
# (bench/e2e/echo_server.c): gRPC core, the server's channel arguments and
# call bookkeeping (grpc_args.c, grpc_call.c), the generated messages and
# loadgen's client call (for --model-info-from) only.
$(BUILD)/echo_server: $(BUILD)/obj/bench/e2e/echo_server.o $(BUILD)/obj/tools/loadgen/client.o \
                      $(BUILD)/obj/server/grpc_args.o $(BUILD)/obj/server/grpc_call.o \
                      $(BUILD)/obj/gen/ikbo/v1/ranker.pb-c.o
	$(CC) $(CFLAGS) -o $@ $^ -lgrpc -lgpr -lprotobuf-c $(LDLIBS)

# Unit tests exercise the engine and the server core; none needs a transport.
$(BUILD)/tests/%: $(BUILD)/obj/tests/unit/%.o $(LIBSERVER) $(LIBIKBO)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -o $@ $(filter %.o,$^) -lcmocka $(CORE_LINK)

# ---- fuzz targets (tests/fuzz) ----
# Each tests/fuzz/fuzz_X.c is a LLVMFuzzerTestOneInput linked with only the
# objects it exercises. $(BUILD)/fuzz_X: the standalone build (any CC; corpus
# replay + seeded mutation loop, fuzz_main.h). $(BUILD)/fuzz/fuzz_X: the
# libFuzzer build, made by `make fuzz` through a sub-make with BUILD=$(BUILD)/fuzz,
# CC=clang and every object under ASan+UBSan (FUZZ_LINK set).
FUZZ_TARGETS := rank_wire request_json config loader
FUZZ_BINS    := $(FUZZ_TARGETS:%=$(BUILD)/fuzz_%)
FUZZ_HDRS    := $(wildcard tests/fuzz/*.h) tests/unit/wire_fixture.h tests/unit/loader_fixture.h
FUZZ_PB      := $(BUILD)/obj/gen/ikbo/v1/ranker.pb-c.o
FUZZ_CHECK   := $(BUILD)/obj/server/pb_check.o $(BUILD)/obj/server/request.o \
                $(BUILD)/obj/server/validate.o $(BUILD)/obj/server/rowset.o \
                $(BUILD)/obj/server/request_json.o $(BUILD)/obj/server/response.o \
                $(BUILD)/obj/server/status.o
FUZZ_WIRE    := $(BUILD)/obj/server/rank_wire.o $(BUILD)/obj/server/pb_arena.o $(FUZZ_CHECK) $(FUZZ_PB)
FUZZ_LINK    ?=
FUZZ_LD       = $(CC) $(CPPFLAGS) $(CFLAGS) $(FUZZ_LINK) -o $@ $< $(filter %.o %.a,$^)

$(BUILD)/fuzz_rank_wire: tests/fuzz/fuzz_rank_wire.c $(FUZZ_WIRE) $(FUZZ_HDRS) | $(GEN_H)
	$(FUZZ_LD) -lprotobuf-c -ljansson $(LDLIBS)
$(BUILD)/fuzz_request_json: tests/fuzz/fuzz_request_json.c $(FUZZ_WIRE) $(FUZZ_HDRS) | $(GEN_H)
	$(FUZZ_LD) -lprotobuf-c -ljansson $(LDLIBS)
$(BUILD)/fuzz_config: tests/fuzz/fuzz_config.c $(BUILD)/obj/server/config.o \
                      $(BUILD)/obj/engine/serving.o $(FUZZ_CHECK) $(FUZZ_PB) $(FUZZ_HDRS) | $(GEN_H)
	$(FUZZ_LD) -lprotobuf-c -ljansson $(LDLIBS)
$(BUILD)/fuzz_loader: tests/fuzz/fuzz_loader.c $(LIBIKBO) $(FUZZ_HDRS)
	$(FUZZ_LD) -ljansson $(CUDA_LIBS) $(LDLIBS) -lstdc++

$(BUILD)/gpu/test_cuda_ops: tests/gpu/test_cuda_ops.c $(LIBIKBO)
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) $(CFLAGS) -o $@ $< $(LIBIKBO) $(CUDA_LIBS) $(LDLIBS) -lstdc++

# jansson linked statically: the GPU machine has no jansson.
$(BUILD)/gpu/test_cuda_model: tests/gpu/test_cuda_model.c $(LIBIKBO)
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) $(CFLAGS) -o $@ $< $(LIBIKBO) -Wl,-Bstatic -ljansson -Wl,-Bdynamic \
	    $(CUDA_LIBS) $(LDLIBS) -lstdc++

# The kernel variants that live only in the benchmark (bench/kernels/variants.cuh).
BENCH_VARIANTS := $(wildcard bench/kernels/lce_v*.cu bench/kernels/attention_v*.cu)
$(BUILD)/gpu/bench_kernels: bench/kernels/bench_kernels.cu $(BENCH_VARIANTS) $(LIBIKBO)
	@mkdir -p $(dir $@)
	$(NVCC) $(filter-out -MMD -MP,$(NVCCFLAGS)) -o $@ $< $(BENCH_VARIANTS) $(LIBIKBO) \
	    -Xlinker -rpath -Xlinker $(CUDA_HOME)/lib64 -lcublasLt -lcublas

$(BUILD)/gpu/bench_ops: bench/kernels/bench_ops.cu $(LIBIKBO)
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) -o $@ $< $(LIBIKBO) -Xlinker -rpath -Xlinker $(CUDA_HOME)/lib64 \
	    -lcublasLt -lcublas

# backend.h lost() against real device errors (a sticky one ends its context).
$(BUILD)/gpu/test_cuda_lost: tests/gpu/test_cuda_lost.cu $(LIBIKBO)
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) -o $@ $< $(LIBIKBO) -Xlinker -rpath -Xlinker $(CUDA_HOME)/lib64 \
	    -lcublasLt -lcublas

# Store patterns of a large pitched write, without arithmetic (linear_tk's question).
$(BUILD)/gpu/write_patterns: bench/kernels/write_patterns.cu kernels/cuda/linear_tk.cu $(LIBIKBO)
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) -o $@ $< $(LIBIKBO) -Xlinker -rpath -Xlinker $(CUDA_HOME)/lib64 \
	    -lcublasLt -lcublas

# mlp2's kernel (the fold's c_r1 part) against two cuBLAS steps (bench/kernels/NOTES.md).
$(BUILD)/gpu/fmlp_proto: bench/kernels/fmlp_proto.cu kernels/cuda/mlp2.cu $(LIBIKBO)
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) -o $@ $< $(LIBIKBO) -Xlinker -rpath -Xlinker $(CUDA_HOME)/lib64 \
	    -lcublasLt -lcublas

# ---- run and test ----
run: deps-build $(BUILD)/ikbo-serve
	$(BUILD)/ikbo-serve --config config/server.json

unit: $(UNIT_BINS)
	@set -e; for t in $(UNIT_BINS); do echo "== $$t"; $$t; done

# fuzz: every target standalone (corpus replay + FUZZ_ITERS mutated inputs),
# then, where clang's libFuzzer runtime is installed, each libFuzzer build
# for FUZZ_SECONDS over its corpus (new inputs go to $(BUILD)/fuzz/corpus/X,
# never into tests/fuzz/corpus). Any crash, leak, UB report or failed check
# fails the run; libFuzzer's artifact lands in $(BUILD)/fuzz/artifacts/.
# fuzz-long: the libFuzzer runs only, FUZZ_SECONDS (default 3600) per target.
FUZZ_ITERS   ?= 20000
FUZZ_SECONDS ?= 20
FUZZ_SAN     := -O1 -g -fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=undefined \
                -fno-omit-frame-pointer
# e.g. FUZZ_SAN_EXTRA=-fsanitize-recover=pointer-overflow FUZZ_UBSAN=...:suppressions=F to run
# past a known finding (tests/fuzz/crashes/README.md), with BUILD=build/x for separate objects.
FUZZ_SAN_EXTRA ?=
FUZZ_UBSAN   ?= print_stacktrace=1:halt_on_error=1
FUZZ_HAVE_LIBFUZZER = $(shell printf 'int LLVMFuzzerTestOneInput(const char *d, unsigned long n)\
  { return d && n; }\n' | clang -x c -fsanitize=fuzzer -o /dev/null - >/dev/null 2>&1 && echo 1)
FUZZ_LIBFUZZER_BINS := $(FUZZ_TARGETS:%=$(BUILD)/fuzz/fuzz_%)

fuzz: $(FUZZ_BINS)
	@set -e; for t in $(FUZZ_TARGETS); do echo "== fuzz_$$t (standalone)"; \
	  if [ $$t = loader ]; then $(BUILD)/fuzz_loader $(FUZZ_ITERS) 1 tests/fuzz/corpus/loader; \
	  else $(BUILD)/fuzz_$$t -n $(FUZZ_ITERS) tests/fuzz/corpus/$$t; fi; done
	@if [ "$(FUZZ_HAVE_LIBFUZZER)" = 1 ]; then $(MAKE) --no-print-directory _fuzz_libfuzzer; \
	else echo "fuzz: clang's libFuzzer runtime not found (libclang-rt-14-dev): libFuzzer runs skipped"; fi

fuzz-long:
	@if [ "$(FUZZ_HAVE_LIBFUZZER)" != 1 ]; then \
	  echo "error: fuzz-long needs clang and its libFuzzer runtime (make deps)"; exit 1; fi
	@$(MAKE) --no-print-directory _fuzz_libfuzzer FUZZ_SECONDS=$(if $(filter command line,$(origin FUZZ_SECONDS)),$(FUZZ_SECONDS),3600)

_fuzz_libfuzzer:
	@env CFLAGS="$(FUZZ_SAN) $(FUZZ_SAN_EXTRA)" $(MAKE) --no-print-directory BUILD=$(BUILD)/fuzz CUDA=0 CC=clang \
	  FUZZ_LINK="-DLIBFUZZER -fsanitize=fuzzer" $(FUZZ_LIBFUZZER_BINS)
	@set -e; mkdir -p $(BUILD)/fuzz/artifacts; for t in $(FUZZ_TARGETS); do \
	  echo "== fuzz_$$t (libFuzzer, $(FUZZ_SECONDS) s)"; mkdir -p $(BUILD)/fuzz/corpus/$$t; \
	  log=$(BUILD)/fuzz/fuzz_$$t.log; \
	  if ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=$(FUZZ_UBSAN) $(BUILD)/fuzz/fuzz_$$t \
	       -max_total_time=$(FUZZ_SECONDS) -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
	       -artifact_prefix=$(BUILD)/fuzz/artifacts/$$t- $(BUILD)/fuzz/corpus/$$t \
	       tests/fuzz/corpus/$$t >$$log 2>&1; then \
	    grep -E '^#[0-9]+.*(DONE|pulse)|^stat::number_of_executed_units' $$log | tail -2; \
	  else tail -40 $$log; echo "fuzz_$$t: FAILED (log $$log)"; exit 1; fi; done

golden: $(BUILD)/ikbo-score $(BUILD)/ikbo-plan
	$(PY) tests/golden/golden.py --score-bin $(BUILD)/ikbo-score --work $(BUILD)/golden
	$(PY) tests/golden/test_plain_models.py
	$(PY) tests/golden/test_importer.py
	$(PY) tests/golden/golden_auto.py --score-bin $(BUILD)/ikbo-score --plan-bin $(BUILD)/ikbo-plan \
	    --work $(BUILD)/golden_auto --require-all

integration: $(BUILD)/ikbo-serve $(BUILD)/ikbo-score $(BUILD)/ikbo-plan $(BUILD)/ikbo-loadgen $(BUILD)/echo_server $(BUILD)/host_path $(GEN_PY)
	@failed=""; for t in $(sort $(wildcard tests/integration/test_*.py)); do \
	  echo "== $$t"; IKBO_BUILD=$(abspath $(BUILD)) IKBO_ROOT=$(CURDIR) $(PY) $$t || failed="$$failed $$t"; \
	done; if [ -n "$$failed" ]; then echo "integration: FAILED:$$failed"; exit 1; fi

# Each binary links only its layers: ikbo-score (engine + request path) must
# not need gRPC core or libevent; an object that drags them in fails here.
check-layers: $(BUILD)/ikbo-score
	@deps=$$(readelf -d $(BUILD)/ikbo-score | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p' | tr '\n' ' '); \
	bad=$$(for d in $$deps; do case $$d in libgrpc*|libgpr*|libevent*) echo $$d;; esac; done); \
	if [ -n "$$bad" ]; then \
	  echo "check-layers: build/ikbo-score needs" $$bad "(it must link neither gRPC nor libevent)"; \
	  exit 1; fi; \
	echo "check-layers: build/ikbo-score needs $$deps"

test: deps
	@$(MAKE) --no-print-directory all
	@$(MAKE) --no-print-directory check-layers
	@$(MAKE) --no-print-directory unit
	@$(MAKE) --no-print-directory fuzz
	@$(MAKE) --no-print-directory alloc-fail
	@$(MAKE) --no-print-directory golden
	@$(MAKE) --no-print-directory integration
	@echo "make test: all passed"

# ThreadSanitizer: the batcher's and the registry's unit tests (instances,
# completers, sweeper; the loader thread against admin calls) with every
# object rebuilt under -fsanitize=thread in $(BUILD)/tsan (CPU only; clang
# when installed, else gcc). CFLAGS goes through the environment so the
# Makefile's own flags are still appended. Any report fails the run
# (halt_on_error).
TSAN_CC := $(if $(shell command -v clang 2>/dev/null),clang,gcc)
TSAN_TESTS := test_batcher test_registry
tsan:
	@env CFLAGS="-O1 -g -fsanitize=thread -fno-omit-frame-pointer" $(MAKE) --no-print-directory \
	  BUILD=$(BUILD)/tsan CUDA=0 CC=$(TSAN_CC) $(TSAN_TESTS:%=$(BUILD)/tsan/tests/%)
	@set -e; for t in $(TSAN_TESTS); do echo "== $$t (tsan)"; \
	  TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1" $(BUILD)/tsan/tests/$$t; done

# Out-of-memory sweeps (tests/alloc/test_alloc_fail.c): the engine and server
# objects' allocation calls are redirected with --wrap to tests/alloc/
# alloc_fail.c, which fails the N-th one and counts live blocks; libraries
# keep the real allocator (jansson and protobuf-c hand-offs: alloc_fail.h).
# AF_SITES gets the call sites reached; coverage.sh compares them with the
# allocation calls in engine/, server/ and kernels/cpu/.
AF_WRAP := malloc calloc realloc free strdup strndup posix_memalign aligned_alloc \
           protobuf_c_message_unpack protobuf_c_message_free_unpacked log_thread_name
AF_OBJS := $(BUILD)/obj/tests/alloc/test_alloc_fail.o $(BUILD)/obj/tests/alloc/alloc_fail.o \
           $(BUILD)/obj/tools/loadgen/client.o
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
