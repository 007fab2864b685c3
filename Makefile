# Two entry points: `make run` (the main job on offline data) and `make test`.
# Each creates .venv from pyproject.toml when it is missing or stale.
PYTHON ?= $(shell command -v python3.12 2>/dev/null || echo python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test bench docs clean

$(STAMP): pyproject.toml
	$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 12), "zoo needs Python >= 3.12 (JAX 0.12); found " + sys.version'
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e ".[dev]"
	touch $(STAMP)

run: $(STAMP)
	$(BIN)/zoo train digits-transformer --remat full

test: $(STAMP)
	$(BIN)/python -m pytest -q -n 2

clean:
	rm -rf $(VENV) runs .pytest_cache
