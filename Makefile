# runplane: `make dev` runs the local stack and a demo run; `make test` runs every test.
SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python
PORT ?= 8080
PYTEST_ARGS ?=
RUNS ?= 3

.PHONY: setup setup-test docker image dev test test-stress test-fast lint typecheck bench validate clean azure-package

setup:
	@scripts/setup.sh

setup-test:
	@scripts/setup.sh --test

docker:
	@scripts/start-docker.sh

image: docker
	@scripts/build-images.sh

dev: setup image
	$(VENV)/bin/runplane dev --port $(PORT) --demo

test: setup-test image
	@scripts/run-tests.sh $(PYTEST_ARGS)

# Unit tests and those on the in-process moto server, Kubernetes' emulator and local fakes: no Docker,
# Slurm, Azurite, dynalite or local stack (tests/conftest.py marks the tests that need them).
test-fast: setup-test
	$(PY) -m pytest -m "not docker and not slow and not slurm and not azurite and not dynalite and not devstack" $(PYTEST_ARGS)

# The flake check: `make test` RUNS times from a clean clone of the committed tree while busy
# loops take every core (scripts/stress-tests.sh).
test-stress:
	@scripts/stress-tests.sh $(RUNS)

lint: setup-test
	$(VENV)/bin/ruff check runplane worker_agent functions tests bench
	$(VENV)/bin/ruff format --check runplane worker_agent functions tests bench

typecheck: setup-test
	$(VENV)/bin/mypy

bench: setup image
	$(PY) bench/submit_latency.py
	$(PY) bench/cold_import.py
	$(PY) bench/e2e_run.py
	$(PY) bench/agent_overhead.py
	$(PY) bench/agent_idle_rss.py
	$(PY) bench/upload_throughput.py
	$(PY) bench/kill_latency.py
	$(PY) bench/dispatch_decision.py
	$(PY) bench/admission.py
	$(PY) bench/first_worker.py
	$(PY) bench/containment_costs.py
	$(PY) bench/network_cost.py
	$(PY) bench/sweeps.py
	$(PY) bench/listing.py
	$(PY) bench/log_reads.py
	$(PY) bench/submit_throughput.py
	$(PY) bench/throughput.py
	$(PY) bench/onebox.py warm
	$(PY) bench/onebox.py batch
	$(PY) bench/onebox.py submit

validate: setup-test
	$(VENV)/bin/cfn-lint template.yaml

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache *.egg-info

# `sam build` (BuildMethod: makefile) calls these with ARTIFACTS_DIR set: the function code and
# its run-time dependencies only, never the local virtualenvs. The sources are copied without
# __pycache__ (tar), which a Python running meanwhile may be writing to.
# The wheels are those of the template's Runtime and Architectures (LAMBDA_PYTHON, LAMBDA_PLATFORM),
# whatever Python builds them: binary wheels only, as Lambda has no compiler.
LAMBDA_PYTHON ?= 3.11
LAMBDA_PLATFORM ?= manylinux2014_x86_64
build-ApiFunction build-DispatcherFunction build-ReaperFunction build-RelayFunction:
	python3 -m pip install --quiet --disable-pip-version-check --target "$(ARTIFACTS_DIR)" \
		--python-version $(LAMBDA_PYTHON) --platform $(LAMBDA_PLATFORM) --implementation cp --only-binary=:all: \
		-r functions/aws/requirements.txt
	mkdir -p "$(ARTIFACTS_DIR)/functions"
	set -o pipefail; tar -c --exclude=__pycache__ runplane functions/__init__.py functions/aws | tar -x -C "$(ARTIFACTS_DIR)"
	find "$(ARTIFACTS_DIR)" -name __pycache__ -prune -exec rm -rf {} +

# The Azure Functions app as `func azure functionapp publish` takes it (infra/azure/README.md):
# function_app.py and host.json at the root, the runplane and functions packages beside them.
AZURE_PACKAGE ?= build/azure-functions
azure-package:
	rm -rf "$(AZURE_PACKAGE)" && mkdir -p "$(AZURE_PACKAGE)/functions"
	cp functions/azure/function_app.py functions/azure/host.json functions/azure/requirements.txt "$(AZURE_PACKAGE)/"
	set -o pipefail; tar -c --exclude=__pycache__ runplane functions/__init__.py functions/azure | tar -x -C "$(AZURE_PACKAGE)"
	rm -f "$(AZURE_PACKAGE)"/functions/azure/local.settings.json*
	find "$(AZURE_PACKAGE)" -name __pycache__ -prune -exec rm -rf {} +
