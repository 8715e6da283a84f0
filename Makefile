# Two commands set up a fresh machine: `make demo` and `make test`. Both create .venv if it is
# missing and install the project with what they need; nothing else has to be installed.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml | cksum | cut -d' ' -f1)

.PHONY: test test-fast check demo bench venv clean

venv: $(STAMP)

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e ".[test,embed,mcp,langgraph]"
	@rm -f $(VENV)/.installed-* && touch $@

test: check
	$(BIN)/python -m pytest -q

# Lint, types and the package's floors (.importlinter): a failure here fails `make test` and CI.
# The core layers are typed strictly; the node and the integrations with mypy's defaults.
check: venv
	$(BIN)/ruff check auth crdt tickets node integrations tests bench memmesh
	$(BIN)/mypy --strict -p memmesh.auth -p memmesh.crdt -p memmesh.tickets
	$(BIN)/mypy -p memmesh.node -p memmesh.integrations
	$(BIN)/lint-imports --no-cache

# Everything but the slow multi-process tests (CI runs them all).
test-fast: venv
	$(BIN)/python -m pytest -q -m "not slow"

demo: venv
	$(BIN)/python -m memmesh.node.demo

# Benchmarks print a table and write JSON under bench/results/ (see docs/benchmarks.md).
bench: venv
	$(BIN)/python -m pip install --quiet -e ".[test,embed,mcp,bench]"
	$(BIN)/python bench/core.py --json bench/results/core.json
	$(BIN)/python bench/recall.py --json bench/results/recall.json
	$(BIN)/python bench/embedders.py --json bench/results/embedders.json
	$(BIN)/python bench/sim.py --json bench/results/sim.json
	$(BIN)/python bench/sync.py --json bench/results/sync.json
	$(BIN)/python bench/hygiene.py --json bench/results/hygiene.json
	$(BIN)/python bench/credentials.py --json bench/results/credentials.json
	$(BIN)/python bench/autorecall.py --json bench/results/autorecall.json
	$(BIN)/python bench/summaries.py --json bench/results/summaries.json
	$(BIN)/python bench/cli.py --json bench/results/cli.json

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
