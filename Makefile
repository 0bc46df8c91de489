# The two commands of the README: `make demo` trains the main job, `make test` runs the suite.
# Both create .venv on first use and install the project into it.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test lint clean

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

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests benchmarks experiments

clean:
	rm -rf runs .pytest_cache
