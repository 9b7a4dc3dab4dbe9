# pdd-router: the two commands of the README are `make demo` and `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
PACKAGES := policies engines_adapter engine_sim router bench replay cli

# The tiers split the tests by marker (tests/conftest.py marks `services` every test of
# tests/integration and tests/e2e and every `redis` test): test-fast + test-services + test-vllm
# is every test, once.
FAST_TESTS := tests/unit tests/contract
FAST_MARKS := not services and not slow and not vllm
SERVICE_MARKS := (services or slow) and not vllm

.PHONY: demo test test-fast coverage test-services test-vllm lint typecheck redis chromium prometheus vllm aiperf bench compose-test clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

## demo: set everything up and run the main job on embedded defaults
demo: $(STAMP)
	$(BIN)/pdd-router demo

## test: set everything up (Redis, Chromium, aiperf, a CPU vLLM, Docker) and run lint, types,
## every test (the fast tier under the coverage gate) and the compose stack
test: lint typecheck coverage test-services test-vllm compose-test

## test-fast: the edit loop, no services: lint, types, and the unit and contract tests that run
## on in-memory fakes (fakeredis, in-process engines); neither slow, nor Redis, nor vLLM
test-fast: $(STAMP) lint typecheck
	$(BIN)/pytest $(FAST_TESTS) -m "$(FAST_MARKS)"

## coverage: the fast tier's tests, failing under 85% of the lines of the decision code
## (policies/, router/scheduler.py, replay/sim/; [tool.coverage] in pyproject.toml)
coverage: $(STAMP)
	$(BIN)/pytest $(FAST_TESTS) -m "$(FAST_MARKS)" --cov --cov-report=term-missing:skip-covered

## test-services: every other test but the real-vLLM ones: Redis, Chromium, aiperf, processes,
## the slow ones
test-services: $(STAMP) redis chromium aiperf prometheus
	$(BIN)/pytest -m "$(SERVICE_MARKS)"

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

## prometheus: Debian's Prometheus, for the test that runs the Grafana dashboard's queries
prometheus:
	./scripts/ensure-prometheus.sh

vllm:
	./scripts/ensure-vllm.sh >/dev/null

## aiperf: NVIDIA aiperf in its own venv outside the repo (~/.cache/pdd-router/aiperf-venv;
## its pins would downgrade .venv's pyzmq, rich and pillow), for tests/e2e/test_aiperf_replay.py
aiperf:
	./scripts/ensure-aiperf.sh >/dev/null

lint: $(STAMP)
	$(BIN)/ruff check $(PACKAGES) tests
	$(BIN)/ruff format --check $(PACKAGES) tests

## typecheck: mypy --strict on the packages, and mypy on the tests without asking for
## annotations. pytest puts each test directory on the path (`from process_support import`),
## so each is checked on its own, its modules named by file, with tests/ on the path too.
MYPY_TESTS := --cache-dir .mypy_cache/tests --allow-untyped-defs --allow-incomplete-defs \
	--allow-untyped-calls --allow-untyped-decorators
typecheck: $(STAMP)
	$(BIN)/mypy
	for dir in tests tests/unit tests/contract tests/integration tests/e2e; do \
		MYPYPATH=tests $(BIN)/mypy $(MYPY_TESTS) $$dir/*.py || exit 1; \
	done

bench: $(STAMP) redis
	$(BIN)/pdd-router bench index

## compose-test: build the Docker image (no registry needed) and run docker-compose.yml for real:
## Redis, two router replicas, simulated P / RLD / MD; checks both replicas, then removes the
## stack and stops a dockerd it started (scripts/compose-test.sh; root or sudo)
compose-test: $(STAMP)
	PYTEST=$(BIN)/pytest ./scripts/compose-test.sh

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .coverage build dist
