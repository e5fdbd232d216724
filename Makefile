# The README's two commands: `make run` and `make test`. Both bootstrap .venv on a fresh clone.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
CONFIG ?= rlsup.toml
# The torch build, chosen deliberately (constraints/README.md). TORCH_INDEX=auto: the CPU build
# where nvidia-smi is absent; where present, PyTorch's CUDA wheel index matched to the CUDA
# version the driver reports (printed). TORCH_INDEX=<index URL> (e.g.
# https://download.pytorch.org/whl/cu128 or .../cpu) forces one. The version is always the pin.
TORCH_INDEX ?= auto
TORCH_PIN := -c constraints/cpu-torch.txt
TORCH_BUILD = $(PY) constraints/torch_build.py install --index '$(TORCH_INDEX)'
PYTEST_ARGS ?=
# A CleanRL checkout for benchmarks/peers.py's PQN row (cleanrl 1.2.0 on PyPI predates PQN);
# empty: that row is skipped. The peers run in a scratch venv outside the project.
PEER_DIR ?=

.PHONY: run test check lint bench doctor torch clean-venv

$(VENV)/.installed-run: pyproject.toml constraints/cpu-torch.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(TORCH_BUILD)
	$(PY) -m pip install -q $(TORCH_PIN) -e .
	touch $@

$(VENV)/.installed-test: pyproject.toml constraints/cpu-torch.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(TORCH_BUILD)
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

# The inner loop: lint and every test that starts no process (`-m "not e2e"`), in minutes.
# `make test` (what CI runs) stays the whole suite.
check: $(VENV)/.installed-test lint
	$(PY) -m pytest -m "not e2e and not slow" -q $(PYTEST_ARGS)

bench: $(VENV)/.installed-run
	$(PY) benchmarks/goodput.py
	$(PY) benchmarks/worker_throughput.py
	$(PY) benchmarks/ppo_roofline.py
	$(PY) benchmarks/replay_save.py --size-gib 2 --method all
	$(PY) benchmarks/checkpoint_stall.py
	$(PY) benchmarks/boot_breakdown.py
	$(PY) benchmarks/recovery.py
	$(PY) benchmarks/supervision_overhead.py
	$(PY) benchmarks/status_latency.py
	$(PY) benchmarks/status_latency.py --games 30
	$(PY) benchmarks/accounting_fold.py
	$(PY) benchmarks/preemption.py
	$(PY) benchmarks/peers.py $(if $(PEER_DIR),--peer-dir '$(PEER_DIR)')

# What this host gives the workers (torch, CUDA, driver, GPUs) and whether the config fits.
doctor: $(VENV)/.installed-run
	$(VENV)/bin/rlsup doctor $(if $(wildcard $(CONFIG)),--config $(CONFIG))

# Switch the installed torch to the build TORCH_INDEX chooses (same version; only torch moves).
torch: $(VENV)/.installed-run
	$(TORCH_BUILD)

clean-venv:
	rm -rf $(VENV)
