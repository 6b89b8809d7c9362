# Two commands on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.tisim-installed
PYTEST_ARGS ?=
# pytest workers: most of a test's time is single-threaded (Taichi's LLVM compile, Python),
# so two workers keep both cores of a 2-core machine busy
TEST_JOBS ?= 2

.PHONY: setup demo test test-fast test-wheel wheel bench docs lint clean

setup: $(STAMP)

# pip --no-compile: byte-compiling every file of every package took 18 of the 54 s of the
# main install; Python compiles the modules it imports, once, on first import
$(STAMP): pyproject.toml setup.py tools/install_system_deps.sh
	@bash tools/install_system_deps.sh
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 10) else "tisim needs Python 3.10 or newer")'
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q --no-compile -e ".[test,docs]"
	@$(BIN)/python -m pip install -q --no-compile "scikit-sparse>=0.4.12,<0.5" \
	  || echo "warning: scikit-sparse (CHOLMOD) could not be built; tisim uses its scipy Cholesky fallback" >&2
	@$(BIN)/python -m pip install -q --no-compile -e ".[mkl]" \
	  || echo "warning: MKL (PARDISO) could not be installed; the cloth solver uses CHOLMOD, about 3x slower per Newton system" >&2
	@touch $(STAMP)

demo: setup
	$(BIN)/tisim demo squeeze-ball

test: setup
	$(BIN)/python -m pytest -n $(TEST_JOBS) --dist worksteal $(PYTEST_ARGS)

test-fast: setup
	$(BIN)/python -m pytest -n $(TEST_JOBS) --dist worksteal -m "not slow" $(PYTEST_ARGS)

# The wheel (demos/ and assets/ inside it as package data) in dist/.
wheel: setup
	$(BIN)/python -m pip wheel --no-deps -w dist .

# The wheel in a fresh venv with its dependencies installed from the index / pip
# cache, as a user's `pip install` does (minutes; `make test` runs the same test with
# the dependencies borrowed from .venv).
test-wheel: setup
	TISIM_WHEEL_DEPS=index $(BIN)/python -m pytest tests/demos/test_package.py $(PYTEST_ARGS)

bench: setup
	$(BIN)/python benchmarks/bench_pd.py --quick
	$(BIN)/python benchmarks/bench_contact.py --resolution 17.6493
	$(BIN)/python benchmarks/bench_admm.py --quick
	$(BIN)/python benchmarks/bench_cloth.py --quick --no-peer

# ruff's lint rules and formatter (pyproject.toml); `make lint` fixes what it safely can.
lint: setup
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

# The documentation site in build/site (the same build the tests check).
docs: setup
	$(BIN)/mkdocs build --strict

clean:
	rm -rf out .pytest_cache build dist *.egg-info
