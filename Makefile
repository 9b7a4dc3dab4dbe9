# pdd-router: the two commands of the README are `make demo` and `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo test lint typecheck unit redis bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

## demo: set everything up and run the main job on embedded defaults
demo: $(STAMP)
	$(BIN)/pdd-router demo

## test: set everything up (Redis included) and run lint, types and the whole test suite
test: $(STAMP) redis lint typecheck
	$(BIN)/pytest

redis:
	./scripts/ensure-redis.sh

lint: $(STAMP)
	$(BIN)/ruff check src tests
	$(BIN)/ruff format --check src tests

typecheck: $(STAMP)
	$(BIN)/mypy

unit: $(STAMP)
	$(BIN)/pytest tests/unit

bench: $(STAMP) redis
	$(BIN)/pdd-router bench index

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache build dist
