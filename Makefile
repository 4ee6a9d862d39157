# The two commands: `make demo` and `make test`. Both set everything up first.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint format bench clean web web-check web-test system dist
WEB := client/web
WEB_DEPS := $(WEB)/node_modules/.package-lock.json

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[dev,ray]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/crowdgrad demo

# System packages the tests need (chromium, clang, lld, node, npm), installed
# with apt-get when missing, or a message saying which are missing.
system:
	sh .ci/system-packages.sh

test: system $(STAMP) web-check web-test
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/python -m pytest -q -m "not slow"

# The browser client (client/web): npm packages from package-lock.json, its
# bundle and kernels.wasm built into client/web/static (committed: a pip
# install needs no node). web-check type-checks the sources (tsc on their JSDoc
# types, tsconfig.json and tsconfig.worker.json), rebuilds both and fails on a
# difference.
$(WEB_DEPS): $(WEB)/package.json $(WEB)/package-lock.json | system
	cd $(WEB) && npm ci --no-audit --no-fund --loglevel=error
	touch $(WEB_DEPS)

web: system $(WEB_DEPS)
	sh $(WEB)/wasm/build.sh
	cd $(WEB) && node build.mjs

web-check: system $(WEB_DEPS)
	cd $(WEB) && npm run --silent typecheck
	sh $(WEB)/wasm/build.sh --check
	cd $(WEB) && node build.mjs --check

web-test: $(WEB_DEPS)
	cd $(WEB) && node --test test/

# The wheel and sdist (the wheel built from the sdist) into dist/; the coordinator
# serves its own wheel at /client/ without this (docs/operations.md).
dist: $(STAMP)
	$(BIN)/python -m pip install --quiet build
	$(BIN)/python -m build --outdir dist .

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports

format: $(STAMP)
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

bench: $(STAMP)
	$(BIN)/python -m pip install --quiet -e '.[bench]'
	$(BIN)/python benchmarks/nn_core.py

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache $(WEB)/node_modules
