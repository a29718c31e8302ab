# Thin wrapper around CMake. `make test` and `make run` work on a fresh Debian 12
# machine as root: missing Debian packages are installed first.
BUILD    ?= build
ASAN_DIR ?= build-asan
JOBS     ?= $(shell nproc)
CMAKE_FLAGS ?=

DEB_PACKAGES = build-essential cmake pkg-config libcmocka-dev libdnnl-dev \
               libopenmpi-dev openmpi-bin libjansson-dev libxxhash-dev libsentencepiece-dev

# `make run` learns an 8,192-token BPE on the fortunes corpus's training split
# (3 s), trains GPT-2 `small` on it for about two and a half minutes and
# draws its loss plot ($(BUILD)/loss.svg); settings chosen by measurement
# (docs/PERFORMANCE.md, 2026-12-07). RUN_STEPS shortens it (the fresh-root
# check uses it) whatever RUN_ARGS says.
RUN_ARGS ?= --config small --schedule default --tokenizer bpe:8192 --lr 2e-3 --steps 210 \
            --metrics $(BUILD)/run-metrics.jsonl --plot $(BUILD)/loss.svg
RUN_STEPS ?=

# `make fuzz`: libFuzzer harnesses (tests/fuzz), FUZZ_SECONDS each, built with
# Debian's clang; what a run finds is written under $(FUZZ_DIR)/artifacts.
FUZZ_DIR     ?= build-fuzz
FUZZ_SECONDS ?= 60
FUZZ_PACKAGES = clang libclang-rt-14-dev libomp-14-dev

.PHONY: all deps build test asan run bench fuzz clean

all: build

deps:
	@tools/install_deps.sh $(DEB_PACKAGES)

build: deps
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release $(CMAKE_FLAGS)
	cmake --build $(BUILD) -j $(JOBS)

test: build
	ctest --test-dir $(BUILD) --output-on-failure -j $(JOBS)

# The same suite built with AddressSanitizer + UBSan (used by CI).
asan: deps
	cmake -S . -B $(ASAN_DIR) -DCMAKE_BUILD_TYPE=Debug -DSLAPO_SANITIZE=ON $(CMAKE_FLAGS)
	cmake --build $(ASAN_DIR) -j $(JOBS)
	ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 \
	LSAN_OPTIONS=suppressions=$(CURDIR)/tools/lsan.supp:print_suppressions=0 \
	UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
	ctest --test-dir $(ASAN_DIR) --output-on-failure -j $(JOBS)

run: build
	@tools/install_deps.sh fortunes
	$(BUILD)/slapo train $(RUN_ARGS) $(if $(RUN_STEPS),--steps $(RUN_STEPS))

# Benchmarks (never run as tests); the PyTorch peer needs python3-torch.
bench: build
	@tools/install_deps.sh python3-torch libopenblas0-openmp
	@for b in $(BUILD)/bench_*; do echo "== $$b"; $$b || exit 1; done
	bench/run_train_bench.sh $(BUILD)

fuzz: deps
	@tools/install_deps.sh $(FUZZ_PACKAGES)
	CC=clang CXX=clang++ cmake -S . -B $(FUZZ_DIR) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSLAPO_FUZZ=ON
	cmake --build $(FUZZ_DIR) -j $(JOBS)
	tools/run_fuzz.sh $(FUZZ_DIR) $(FUZZ_SECONDS)

clean:
	rm -rf $(BUILD) $(ASAN_DIR) $(FUZZ_DIR)
