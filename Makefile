# Two commands for a fresh machine (see the README):
#   make run    set up .venv (core + the hf extra) and run the default job (a small net on synthetic data)
#   make test   set up .venv with the test extra and run the test suite
#   make lint   ruff and mypy, as configured in pyproject.toml
#   make docs   the documentation as a static site in site/ (mkdocs build --strict)
# Pass Hydra overrides with ARGS, e.g. make run ARGS="+experiment=clamp_conv".

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# The CPU machines this project runs on carry these wheels locally; elsewhere pip fetches them.
TORCH ?= torch==2.14.1 torchvision==0.29.1
ARGS ?=
PYTEST_ARGS ?=

.PHONY: setup run test lint docs clean

# Two stamps: `make run` needs the core and the hf extra (the default job and the README's
# tour), not the test extra (SAELens, TransformerLens, Lightning, nnsight, playwright, the
# linters: minutes to install); `make test` adds the test extra on top.
$(BIN)/.installed-run: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet $(TORCH)
	$(BIN)/python -m pip install --quiet -e ".[hf]"
	touch $@

$(BIN)/.installed: $(BIN)/.installed-run
	$(BIN)/python -m pip install --quiet -e ".[test]"
	touch $@

setup: $(BIN)/.installed

run: $(BIN)/.installed-run
	$(BIN)/python -m hookgraph $(ARGS)

# compileall first: the tests start ~100 Python processes (the command line, sweeps, ranks), and
# where PYTHONDONTWRITEBYTECODE is set (as on the project's machines) each recompiled hookgraph,
# ~0.3 s of its start; compileall writes the caches whatever that variable says.
#
# -n auto: pytest-xdist runs the suite on every core (one worker a core; conftest.py gives each its
# share of torch's threads). --dist loadfile hands out whole files: a module-scoped fixture (a
# GPT-2, the multirun of every experiment) is built once, not once per worker. (loadgroup would
# split files finer, but under pytest 9.2 xdist 3.8's groups are silently ignored: it renames
# item._nodeid, which pytest 9 no longer reads.) Pass PYTEST_ARGS="-n 0" for one process.
# --no-loadscope-reorder: xdist would hand out the files with the most tests first, so the few-test
# slow files (the multirun of every experiment, the submitit and joblib sweeps, torchrun) came last
# and the last ran alone; conftest.py orders the files slowest first (tests/schedule.py) instead.
# PYTEST_DISABLE_PLUGIN_AUTOLOAD, then -p for the two plugins the suite uses (xdist, Hypothesis's):
# packages of the test extra install pytest plugins no test uses (jaxtyping, typeguard, anyio,
# Hydra's, platformdirs'), and pytest marks every module of a package that has one for assertion
# rewriting; where PYTHONDONTWRITEBYTECODE is set nothing caches that, and each worker re-parsed
# and rewrote Hydra's and Hypothesis's ~180 modules as they were imported (~2.5 CPU-s a worker).
test: setup
	$(BIN)/python -m compileall -q -j 0 hookgraph hydra_plugins >/dev/null
	PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 $(BIN)/python -m pytest -q -p xdist -p hypothesispytest \
		-n auto --dist loadfile --no-loadscope-reorder $(PYTEST_ARGS)

lint: setup
	$(BIN)/ruff check hookgraph hydra_plugins tests benchmarks
	$(BIN)/mypy

# The docs extra goes into the same .venv; --strict fails on a broken link, page or anchor
# (not with --quiet, which hides the warnings that strict counts).
$(BIN)/.docs-installed: $(BIN)/.installed
	$(BIN)/python -m pip install --quiet -e ".[docs]"
	touch $@

docs: $(BIN)/.docs-installed
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

clean:
	rm -rf $(VENV) runs/*/ .pytest_cache site
