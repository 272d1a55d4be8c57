# The README's two commands, and the steps they are made of.
#   make demo   installs what is missing, builds, trains Fashion-MNIST in bf16, prints accuracy
#   make test   installs what is missing, builds everything, runs every test
#   make bench  installs what is missing, builds the benchmarks, runs the side-by-side anchors
#   make sanitize  the sanitizer build, its tests and a bounded fuzzing run
JOBS ?= $(shell nproc)
DEMO_FLAGS ?= --bf16 --num_train_epochs 1 --learning_rate 2e-3 --per_device_train_batch_size 64 \
              --per_device_eval_batch_size 1000 \
              --logging_steps 100 --output_dir build/demo-output --overwrite_output_dir

# bench/anchors' flags (--help lists them); empty = the settings BENCHMARKS.md quotes.
BENCH_FLAGS ?=

.PHONY: all bootstrap configure build test demo bench sanitize clean
all: build

bootstrap:
	scripts/bootstrap

configure: bootstrap
	cmake --preset default

build: configure
	cmake --build --preset default -j $(JOBS)

test: build
	ctest --preset default -j $(JOBS)

demo: build
	build/examples/fashion_mnist $(DEMO_FLAGS)

# Trainer vs hand-written LibTorch, PyTorch and HF Trainer, bf16 vs fp32, peak memory
# (BENCHMARKS.md). Prints a table and a JSON line, also written to build/bench/anchors.json.
bench: configure
	cmake --build --preset default -j $(JOBS) --target trainer_bench fused_adamw_bench
	bench/anchors --output build/bench/anchors.json $(BENCH_FLAGS)

# clang ASan + UBSan build in build-asan/: the CPU tests, every committed fuzz input, then
# FUZZ_SECONDS (60) of fuzzing per target (docs/building.md, "Fuzzing and sanitizers").
sanitize:
	JOBS=$(JOBS) scripts/sanitize-and-fuzz

clean:
	rm -rf build
