# The README's two commands: `make run` and `make test`. Both bootstrap .venv on a fresh clone.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
CONFIG ?= rlsup.toml
# CPU torch unless this host has an NVIDIA driver (then pip resolves the CUDA build).
TORCH_PIN := $(if $(shell command -v nvidia-smi 2>/dev/null),,-c constraints/cpu-torch.txt)
PYTEST_ARGS ?=

.PHONY: run test lint bench clean-venv

$(VENV)/.installed-run: pyproject.toml constraints/cpu-torch.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q $(TORCH_PIN) -e .
	touch $@

$(VENV)/.installed-test: pyproject.toml constraints/cpu-torch.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q $(TORCH_PIN) -e '.[test]'
	touch $@ $(VENV)/.installed-run

run: $(VENV)/.installed-run
	test -f $(CONFIG) || $(VENV)/bin/rlsup init $(CONFIG)
	$(VENV)/bin/rlsup run --config $(CONFIG)

lint: $(VENV)/.installed-test
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports

test: $(VENV)/.installed-test lint
	$(PY) -m pytest $(PYTEST_ARGS)

bench: $(VENV)/.installed-run
	$(PY) benchmarks/worker_throughput.py
	$(PY) benchmarks/replay_save.py --size-gib 2 --method all
	$(PY) benchmarks/recovery.py
	$(PY) benchmarks/supervision_overhead.py
	$(PY) benchmarks/status_latency.py

clean-venv:
	rm -rf $(VENV)
