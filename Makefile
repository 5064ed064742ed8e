# Two entry points: `make demo` runs the demo pipeline, `make test` runs the whole suite.
# Both create .venv and install everything they need into it.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev,postgres,redis,ui,testing,otel,rabbitmq,langgraph]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/python examples/demo.py

lint: $(STAMP)
	$(BIN)/ruff check nestegg tests bench examples
	$(BIN)/ruff format --check nestegg tests bench examples
	$(BIN)/mypy

test: $(STAMP) lint
	-bash .ci/browser  # Debian's Chromium for the browser tests (they skip without it, fail under CI=true)
	$(BIN)/python -m pytest -q

bench: $(STAMP)
	bash bench/setup.sh
	.venv-bench/bin/python bench/run_all.py

clean:
	rm -rf $(VENV) .venv-bench .pytest_cache .mypy_cache .ruff_cache
