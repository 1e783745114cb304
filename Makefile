# Two commands for a fresh machine (see the README):
#   make run    set up .venv and run the default job (a small net on synthetic data)
#   make test   set up .venv and run the test suite
#   make lint   ruff and mypy, as configured in pyproject.toml
# Pass Hydra overrides with ARGS, e.g. make run ARGS="+experiment=clamp_conv".

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# The CPU machines this project runs on carry these wheels locally; elsewhere pip fetches them.
TORCH ?= torch==2.14.1 torchvision==0.29.1
ARGS ?=
PYTEST_ARGS ?=

.PHONY: setup run test lint clean

$(BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet $(TORCH)
	$(BIN)/python -m pip install --quiet -e ".[test]"
	touch $@

setup: $(BIN)/.installed

run: setup
	$(BIN)/python -m hookgraph $(ARGS)

test: setup
	$(BIN)/python -m pytest -q $(PYTEST_ARGS)

lint: setup
	$(BIN)/ruff check hookgraph tests benchmarks
	$(BIN)/mypy

clean:
	rm -rf $(VENV) runs/*/ .pytest_cache
