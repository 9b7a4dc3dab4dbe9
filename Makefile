# pdd-router: the two commands of the README are `make demo` and `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
PACKAGES := policies engines_adapter engine_sim router bench replay cli

.PHONY: demo test test-fast test-vllm lint typecheck unit redis chromium vllm aiperf bench compose-test clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

## demo: set everything up and run the main job on embedded defaults
demo: $(STAMP)
	$(BIN)/pdd-router demo

## test: set everything up (Redis, Chromium, aiperf, a CPU vLLM, Docker) and run lint, types
## and every test, the compose stack's included
test: test-fast test-vllm compose-test

## test-fast: lint, types and every test that needs no real vLLM
test-fast: $(STAMP) redis chromium aiperf lint typecheck
	$(BIN)/pytest -m "not vllm"

## test-vllm: the tests that run real vLLM engines on the CPU (installed once, cached).
## Two CPU engines share 2 cores with the tests, so timing-dependent steps (an engine
## answering a probe, MD being ready before RLD's output ends) can miss on a loaded
## machine: a failed test is run again, at most twice.
test-vllm: $(STAMP) vllm
	PDD_ROUTER_TEST_VLLM=1 $(BIN)/pytest -m vllm --reruns 2

redis:
	./scripts/ensure-redis.sh

chromium:
	./scripts/ensure-chromium.sh

vllm:
	./scripts/ensure-vllm.sh >/dev/null

## aiperf: NVIDIA aiperf in its own venv outside the repo (~/.cache/pdd-router/aiperf-venv;
## its pins would downgrade .venv's pyzmq, rich and pillow), for tests/e2e/test_aiperf_replay.py
aiperf:
	./scripts/ensure-aiperf.sh >/dev/null

lint: $(STAMP)
	$(BIN)/ruff check $(PACKAGES) tests
	$(BIN)/ruff format --check $(PACKAGES) tests

typecheck: $(STAMP)
	$(BIN)/mypy

unit: $(STAMP)
	$(BIN)/pytest tests/unit

bench: $(STAMP) redis
	$(BIN)/pdd-router bench index

## compose-test: build the Docker image (no registry needed) and run docker-compose.yml for real:
## Redis, two router replicas, simulated P / RLD / MD; checks both replicas, then removes the
## stack and stops a dockerd it started (scripts/compose-test.sh; root or sudo)
compose-test: $(STAMP)
	PYTEST=$(BIN)/pytest ./scripts/compose-test.sh

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache build dist
