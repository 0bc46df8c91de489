# The two commands of the README: `make demo` trains the main job, `make test` runs the suite.
# Both create .venv on first use and install the project into it.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test lint test-c-sanitized clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.14.1 torchvision==0.29.1
	$(PY) -m pip install -q -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/vitmix train --mixer laplacian

# PYTEST_ARGS: extra pytest arguments, e.g. test paths (CI's fresh-machine pass runs a part of the suite)
PYTEST_ARGS ?=

test: $(STAMP)
	$(PY) -m pytest -q -n 2 --dist loadgroup $(PYTEST_ARGS)

# the C kernels' sources: every library compiles without a warning, with OpenMP and without (the build's fallback)
CSRC := src/vitmix/ops/csrc
FUSED_CSRC := src/vitmix/mixers/fused/csrc
CWARN := -std=c99 -fsyntax-only -Wall -Wextra -Werror -Wno-unknown-pragmas -D_POSIX_C_SOURCE=200809L -march=native

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests benchmarks experiments
	for f in $(CSRC)/*.c $(FUSED_CSRC)/*.c; do \
	  $(CC) $(CWARN) -I$(CSRC) -fopenmp $$f && $(CC) $(CWARN) -I$(CSRC) $$f || exit 1; done

# The C op tests once with every C library built under AddressSanitizer + UBSan (VITMIX_C_SANITIZE=1: its own
# cache entry). Python is not instrumented, so the ASan runtime is preloaded, with libstdc++ after it (ASan's
# __cxa_throw interceptor needs it at start; Triton's import throws). Leak checks are off: Python's own
# allocations would be reported.
# (the Triton tests, which run no C, are left out)
C_OP_TESTS ?= tests/ops/test_cbuild.py tests/ops/newton/test_newton.py tests/ops/kernel/test_kernel.py \
	tests/ops/diagonal/test_diagonal.py tests/ops/nystrom tests/mixers/test_laplacian.py tests/mixers/test_soft.py

test-c-sanitized: $(STAMP)
	LD_PRELOAD="$$($(CC) -print-file-name=libasan.so) $$($(CC) -print-file-name=libstdc++.so)" \
	ASAN_OPTIONS=detect_leaks=0 UBSAN_OPTIONS=print_stacktrace=1 VITMIX_C_SANITIZE=1 \
	$(PY) -m pytest -q -n 2 -p no:cacheprovider $(C_OP_TESTS)

clean:
	rm -rf runs .pytest_cache
