# hyserve: one non-recursive Makefile. `make help` lists the targets.
#
# SANITIZE=1 builds everything with AddressSanitizer + UndefinedBehaviorSanitizer
# into build-san/, so a sanitized and a plain build can live side by side.
# CHECKS=1 (implied by SANITIZE=1) also runs the invariant checkers on the
# per-step path (engine/invariant.h); alone it builds into build-checks/.
#
# One test at a time (each target builds first; `make help` lists them):
#   make test-unit T=NAME     C unit tests: T is a full test name, a part of
#                             names, or several; T='-m cache' one module;
#                             T=--list prints the names
#   make test-ref K=PATTERN   reference cases whose name contains PATTERN
#   make test-http K=PATTERN  HTTP tests (functions of tests/suite_http.py)
#   make test-memory K=PATTERN  cache memory tests (tests/suite_memory.py)
#   make test-families K=PATTERN  the hybrid families served (tests/suite_families.py)
#   make test-spec K=PATTERN  speculative decoding served (tests/suite_spec.py)

CC      ?= cc
PYTHON  ?= /usr/bin/python3
SANITIZE ?= 0
CHECKS  ?= $(SANITIZE)
# which packages `deps` makes sure of: all (build and tests) or build (only
# what compiling needs: the Docker image's build stage)
DEPS    ?= all

ifeq ($(SANITIZE),1)
BUILD   := build-san
SANFLAGS := -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined
OPT     := -O1 -g
else ifeq ($(CHECKS),1)
BUILD   := build-checks
SANFLAGS :=
OPT     := -O2 -g
else ifeq ($(MMPROF),1)
BUILD   := build-prof
SANFLAGS :=
OPT     := -O2 -g
else
BUILD   := build
SANFLAGS :=
OPT     := -O2 -g
endif
ifeq ($(CHECKS),1)
CHECKFLAGS := -DHYSERVE_CHECKS
endif
# MMPROF=1: a build (build-prof/) whose matrix products time themselves and
# print, at exit, wall time and GB/s per product shape (matmul.c, HYSERVE_MMPROF)
ifeq ($(MMPROF),1)
CHECKFLAGS += -DHYSERVE_MMPROF
endif

BLAS_INC := $(shell test -d /usr/include/x86_64-linux-gnu/openblas-openmp && echo -I/usr/include/x86_64-linux-gnu/openblas-openmp)
# the rooms' headers, found by base name as before the rooms existed
INC     := -Iengine -Igrammar -Iruntime -Iplanning -Iserver -Icli
WARN    := -Wall -Wextra -Wshadow -Wstrict-prototypes -Wmissing-prototypes -Wpointer-arith \
           -Wformat=2 -Wvla -Wno-unused-parameter -Werror=implicit-function-declaration
CFLAGS  += -std=c11 -D_GNU_SOURCE $(OPT) $(CHECKFLAGS) $(WARN) -fopenmp -pthread -MMD -MP $(INC) $(BLAS_INC) $(SANFLAGS)
LDFLAGS += -fopenmp -pthread $(SANFLAGS)
LDLIBS  += -lopenblas -lmicrohttpd -lcjson -lzmq -lm

# the library every binary links: the engine and the rooms beside it (the
# grammar library, the batching runtime, the planner; docs/architecture.md 2)
ENGINE_SRC := $(sort $(wildcard engine/*.c engine/kernels/*.c grammar/*.c runtime/*.c planning/*.c))
SERVER_SRC := $(sort $(wildcard server/*.c))
CLI_SRC    := $(sort $(wildcard cli/*.c))
TEST_SRC   := $(sort $(wildcard tests/test_*.c)) tests/runner.c
# the dashboard (GET /): its files become C arrays in build/gen/ at build time
WEB_SRC    := $(sort $(wildcard server/web/*.html server/web/*.js server/web/*.css server/web/*.svg))

ENGINE_OBJ := $(ENGINE_SRC:%.c=$(BUILD)/%.o)
SERVER_OBJ := $(SERVER_SRC:%.c=$(BUILD)/%.o) $(BUILD)/gen/web_assets.o
CLI_OBJ    := $(CLI_SRC:%.c=$(BUILD)/%.o)
TEST_OBJ   := $(TEST_SRC:%.c=$(BUILD)/%.o)

HYSERVE := $(BUILD)/hyserve
TESTBIN := $(BUILD)/hyserve-tests

# libFuzzer targets (tests/fuzz/fuzz_NAME.c): Debian's clang with its
# fuzzer runtime, ASan + UBSan, in build-fuzz/ whatever SANITIZE says.
# `make fuzz` runs each for FUZZ_SECONDS from its seed corpus (new inputs
# go to tests/tmp/fuzz/NAME); `make test` runs each for a fixed number of
# inputs and every regression input (tests/suite_fuzz.sh).
FUZZ_CC      ?= clang
FUZZ_SECONDS ?= 60
FUZZ_BUILD   := build-fuzz
FUZZ_SAN     := -fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer
FUZZ_CFLAGS  := -std=c11 -D_GNU_SOURCE -O1 -g -DHYSERVE_CHECKS $(WARN) -fopenmp -pthread -MMD -MP \
                -Iengine -Igrammar -Iruntime -Iplanning -Iserver $(BLAS_INC) $(FUZZ_SAN) -fsanitize=fuzzer-no-link
FUZZ_NAMES   := $(patsubst tests/fuzz/fuzz_%.c,%,$(sort $(wildcard tests/fuzz/fuzz_*.c)))
FUZZ_OBJ     := $(ENGINE_SRC:%.c=$(FUZZ_BUILD)/%.o) $(SERVER_SRC:%.c=$(FUZZ_BUILD)/%.o) $(FUZZ_BUILD)/gen/web_assets.o
FUZZ_BINS    := $(FUZZ_NAMES:%=$(FUZZ_BUILD)/fuzz_%)

.PHONY: FORCE all fuzz-build fuzz soak run test test-unit test-ref test-http test-memory test-gateway test-kvevents test-connections test-spec test-dashboard test-deploy bench bench-prefix bench-spec bench-int8 bench-split clean help deps

all: deps $(HYSERVE) $(TESTBIN) ## build the hyserve binary and the unit-test runner

# order-only on deps: under `make -j` no object compiles before the
# packages (and so the headers) it needs are installed
$(BUILD)/%.o: %.c | deps
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c $< -o $@

$(BUILD)/gen/web_assets.c: $(WEB_SRC) tools/embed_web.py | deps
	@mkdir -p $(dir $@)
	$(PYTHON) tools/embed_web.py -o $@ $(WEB_SRC)

$(BUILD)/gen/web_assets.o: $(BUILD)/gen/web_assets.c
	$(CC) $(CFLAGS) -c $< -o $@

# the git commit baked into the binary (hyserve --version, /info, hyserve_build_info);
# GIT_COMMIT=... names it where there is no .git (a Docker build context). The
# stamp file changes only when the commit does, so only server/version.o rebuilds.
GIT_COMMIT ?= $(shell git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)
$(BUILD)/gen/commit.txt: FORCE
	@mkdir -p $(dir $@)
	@echo '$(GIT_COMMIT)' > $@.tmp
	@if cmp -s $@.tmp $@; then rm -f $@.tmp; else mv $@.tmp $@; fi
$(BUILD)/server/version.o: $(BUILD)/gen/commit.txt
$(BUILD)/server/version.o: CFLAGS += -DHYSERVE_GIT_COMMIT='"$(GIT_COMMIT)"'
FORCE:

$(HYSERVE): $(ENGINE_OBJ) $(SERVER_OBJ) $(CLI_OBJ)
	$(CC) $(LDFLAGS) $^ $(LDLIBS) -o $@

$(TESTBIN): $(ENGINE_OBJ) $(SERVER_OBJ) $(TEST_OBJ)
	$(CC) $(LDFLAGS) $^ $(LDLIBS) -o $@

$(FUZZ_BUILD)/%.o: %.c | deps
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_CFLAGS) -c $< -o $@

# the kernel table's CPU probe names features clang 14 does not know
# (amx-tile, avxvnni), and clang takes minutes over the SIMD kernels with
# ASan; none of them parses input, so gcc builds them uninstrumented
FUZZ_PLAIN := $(patsubst %.c,$(FUZZ_BUILD)/%.o,engine/kernels/cpu.c $(wildcard engine/kernels/simd_*.c))
$(FUZZ_PLAIN): $(FUZZ_BUILD)/%.o: %.c | deps
	@mkdir -p $(dir $@)
	$(CC) -std=c11 -D_GNU_SOURCE -O2 -g $(WARN) -MMD -MP -Iengine -c $< -o $@

$(FUZZ_BUILD)/gen/web_assets.o: $(BUILD)/gen/web_assets.c
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_CFLAGS) -c $< -o $@

$(FUZZ_BUILD)/fuzz_%: $(FUZZ_BUILD)/tests/fuzz/fuzz_%.o $(FUZZ_OBJ)
	$(FUZZ_CC) -fopenmp -pthread $(FUZZ_SAN) -fsanitize=fuzzer $^ $(LDLIBS) -o $@

.SECONDARY: $(FUZZ_OBJ) $(FUZZ_NAMES:%=$(FUZZ_BUILD)/tests/fuzz/fuzz_%.o)

fuzz-build: $(FUZZ_BINS) ## build the libFuzzer targets (clang) into build-fuzz/

fuzz: fuzz-build ## run each libFuzzer target FUZZ_SECONDS (default 60) from its seed corpus
	@FUZZ_DIR=$(FUZZ_BUILD) sh tests/suite_fuzz.sh --seconds $(FUZZ_SECONDS) $(FUZZ_NAMES)

deps: ## install missing Debian packages (needs root; no-op when present)
	@sh tools/install-deps.sh $(DEPS)

# make run PORT=8081 HOST=0.0.0.0 THREADS=2 MODEL=FILE (each optional; tools/run.sh);
# it builds only the server and installs only the build packages
run: DEPS = build
run: $(HYSERVE) ## serve models/default.gguf on 127.0.0.1:8080; PORT= HOST= THREADS= MODEL=FILE
	@PORT='$(PORT)' HOST='$(HOST)' THREADS='$(THREADS)' MODEL='$(MODEL)' sh tools/run.sh $(HYSERVE)

test: all fuzz-build ## run every test: unit, numpy reference, HTTP black-box, fuzz regressions
	@HYSERVE=$(HYSERVE) TESTBIN=$(TESTBIN) PYTHON=$(PYTHON) FUZZ_DIR=$(FUZZ_BUILD) sh tests/run.sh

# the environment tests/run.sh gives every suite
TESTENV := HYSERVE=$(HYSERVE) TESTBIN=$(TESTBIN) PYTHON=$(PYTHON) OMP_WAIT_POLICY=$${OMP_WAIT_POLICY:-PASSIVE}

test-unit: all ## C unit tests; T=NAME (full name or part), T='-m MODULE', T=--list
	@case " $(T) " in *" --list "*) ;; *) [ -f tests/tmp/qwen3-tokenizer.gguf ] || \
	    sh tools/qwen3-tokenizer-gguf.sh || echo "warning: no Qwen3 tokenizer fixture; its test will fail" >&2 ;; esac
	@$(TESTENV) $(TESTBIN) $(T)

test-ref: all ## numpy reference cases; K=PATTERN picks by name
	@$(TESTENV) sh tests/suite_reference.sh $(if $(K),-k '$(K)')

test-http: all ## HTTP black-box tests; K=PATTERN picks test functions by name
	@$(TESTENV) sh tests/suite_http.sh $(if $(K),-k '$(K)')

test-memory: all ## cache memory tests on a live server; K=PATTERN picks by name
	@$(TESTENV) sh tests/suite_memory.sh $(if $(K),-k '$(K)')

test-gateway: all ## the inference gateway protocol: metrics listener, scrapes under load, render routes (tests/suite_gateway.py)
	@$(TESTENV) sh tests/suite_gateway.sh $(if $(K),-k '$(K)')

test-kvevents: all ## KV events over ZMQ decoded by an independent subscriber (tests/suite_kvevents.py); K=PATTERN
	@$(TESTENV) sh tests/suite_kvevents.sh $(if $(K),-k '$(K)')

test-connections: all ## connections at the issue's scale: 10,000 idle, 1,000 tricklers, 1,000 streams (tests/suite_connections.py)
	@$(TESTENV) CONN_SCALE=full sh tests/suite_connections.sh

test-families: all ## every hybrid family served (tests/suite_families.py); K=PATTERN picks by name
	@$(TESTENV) sh tests/suite_families.sh $(if $(K),-k '$(K)')

test-spec: all ## speculative decoding served: predictions, n-gram, rollback per family (tests/suite_spec.py); K=PATTERN
	@$(TESTENV) sh tests/suite_spec.sh $(if $(K),-k '$(K)')

test-dashboard: all ## the dashboard (GET /) in headless Chromium; screenshots in tests/tmp/dashboard/
	@$(TESTENV) sh tests/suite_dashboard.sh

# docs/options.md: rendered from server/config.c's option tables (OPTS, ENV_SWITCHES);
# tests/suite_options.sh fails when it is stale
.PHONY: docs-options
docs-options: ## regenerate docs/options.md (every serve option and HYSERVE_* variable)
	@$(PYTHON) tools/gen_options_doc.py

test-deploy: ## build the Docker images, run three replicas behind nginx and check them (needs root)
	@sh tools/test-deploy.sh

soak: all ## SOAK_CLIENTS (32) streaming clients for SOAK_SECONDS (600) against a live server (tools/soak.py)
	@$(PYTHON) tools/soak.py --hyserve $(HYSERVE) --seconds $${SOAK_SECONDS:-600} --clients $${SOAK_CLIENTS:-32} --rss-tolerance 0.05

bench: all ## run the benchmarks, results under bench/results/
	@HYSERVE=$(HYSERVE) PYTHON=$(PYTHON) sh bench/run.sh

$(BUILD)/bench/hyserve-bench: bench/bench.c $(ENGINE_OBJ)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(LDFLAGS) $^ $(LDLIBS) -o $@

bench-families: all $(BUILD)/bench/hyserve-bench ## each hybrid family: prompt, decode vs the triad, MoE grouping (bench/results/families-latest.md)
	@HYSERVE=$(HYSERVE) PYTHON=$(PYTHON) BENCH_BIN=$(BUILD)/bench/hyserve-bench sh bench/families.sh

bench-spec: all ## speculative decoding vs none: predictions, n-gram (bench/results/spec-latest.md)
	@HYSERVE=$(HYSERVE) PYTHON=$(PYTHON) sh bench/spec.sh

bench-prefix: all ## the prefix cache on vs off: multi-turn TTFT, a shared system prompt (bench/results/prefix-latest.md)
	@HYSERVE=$(HYSERVE) PYTHON=$(PYTHON) sh bench/prefix.sh

# matmul alone, int8 against f32 prompt products (bench/int8_ab.c): the evidence of matmul.c's
# automatic choice per level; the AVX2 levels against OpenBLAS's Haswell core, as an AVX2 CPU runs
$(BUILD)/bench/hyserve-int8-ab: bench/int8_ab.c $(ENGINE_OBJ)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(LDFLAGS) $^ $(LDLIBS) -o $@

# the K-quant decode kernels alone, one thread, rows in L2 and from memory (bench/kq_rows.c)
$(BUILD)/bench/hyserve-kq-rows: bench/kq_rows.c $(ENGINE_OBJ)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(LDFLAGS) $^ $(LDLIBS) -o $@

# the F32/F16/BF16/Q8_0 one-token kernels alone, one thread, against a one-thread triad (bench/mv_rows.c)
$(BUILD)/bench/hyserve-mv-rows: bench/mv_rows.c $(ENGINE_OBJ)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(LDFLAGS) $^ $(LDLIBS) -o $@

# libgomp's regions, barriers and join waits per token (bench/gomp_prof.c, an LD_PRELOAD shim)
$(BUILD)/bench/gomp_prof.so: bench/gomp_prof.c
	@mkdir -p $(dir $@)
	$(CC) -O2 -Wall -Wextra -shared -fPIC $< -o $@ -ldl

bench-profile: all $(BUILD)/bench/gomp_prof.so ## MODEL=FILE: where a decode token's time goes: regions, waits, each product's GB/s
	@$(MAKE) --no-print-directory MMPROF=1 build-prof/hyserve >/dev/null
	@sh bench/profile.sh $(MODEL)

bench-int8: $(BUILD)/bench/hyserve-int8-ab ## int8 vs f32 prompt products per kernel level (matmul.c's int8 thresholds)
	@for l in avx512-vnni avx512; do $< -l $$l; done
	@for l in avx2+vnni avx2; do OPENBLAS_CORETYPE=Haswell $< -l $$l; done

# decode with share.h's stealing split against the fixed split, alternating in one process
$(BUILD)/bench/hyserve-split-ab: bench/split_ab.c $(ENGINE_OBJ)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(LDFLAGS) $^ $(LDLIBS) -o $@

bench-split: $(BUILD)/bench/hyserve-split-ab ## MODEL=FILE: decode, threads stealing rows vs fixed shares (share.h)
	@$< -m $(or $(MODEL),bench/models/q35-q4_k.gguf)

# a speculative verify step: exact k tokens vs plain k tokens vs k one-token steps (bench/verify_ab.c)
$(BUILD)/bench/hyserve-verify-ab: bench/verify_ab.c $(ENGINE_OBJ)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(LDFLAGS) $^ $(LDLIBS) -o $@

bench-verify: $(BUILD)/bench/hyserve-verify-ab ## MODEL=FILE [K=8]: an exact verify step's cost against a plain one and one-token steps
	@$< -m $(or $(MODEL),bench/models/q35-q8_0.gguf) -d $(or $(K),8)

# this tree's engine against commit BASE's, alternating: prompt tokens/s per length, decode tokens/s
bench-ab: all ## BASE=REV [TYPES="q8_0 q4_k"]: engine speed against another commit (bench/results/tree-ab-latest.md)
	@PYTHON=$(PYTHON) BUILD=$(BUILD) sh bench/tree_ab.sh $(BASE) $(TYPES)

clean: ## remove build outputs
	rm -rf build build-san build-checks build-fuzz tests/tmp

help: ## list the targets
	@grep -hE '^[a-z0-9-]+:.*## ' Makefile | sed 's/:.*## /\t/' | expand -t 12

-include $(ENGINE_OBJ:.o=.d) $(SERVER_OBJ:.o=.d) $(CLI_OBJ:.o=.d) $(TEST_OBJ:.o=.d) $(wildcard $(FUZZ_BUILD)/*/*.d $(FUZZ_BUILD)/*/*/*.d)
