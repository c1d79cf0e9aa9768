#!/usr/bin/env bash
# The GPU suite on one NVIDIA GPU: set up from PyPI, verify and time the seed kernels against the
# best public baselines, run a short swarm, print the tables (within ~8 minutes on one H200).
#
#   benchmarks/gpu_suite.sh                 # on a GPU machine, from the repository root
#   benchmarks/gpu_suite.sh --dry-run       # anywhere: the interpreter path on CPU, tiny shapes, no timing
#
# Extra arguments go to benchmarks/gpu_suite.py (--problems, --rounds, --swarm-budget, --json, ...).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
dry=0
for a in "$@"; do [[ "$a" == "--dry-run" ]] && dry=1; done

if [[ $dry == 0 ]]; then
  if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
    echo "gpu_suite: no NVIDIA GPU here (nvidia-smi finds none). Run it on a GPU machine, or" \
         "use --dry-run for the CPU interpreter path." >&2
    exit 3
  fi
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu --format=csv
  # the project with its GPU extra, and the public baselines it is measured against
  $PY -m pip install -q -e '.[gpu]'
  for pkg in liger-kernel flash-linear-attention quack-kernels; do
    # a baseline that does not install is reported "unavailable here", never faked
    $PY -m pip install -q "$pkg" || echo "gpu_suite: $pkg did not install; its baseline will read unavailable" >&2
  done
  $PY -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 4)' || {
    echo "gpu_suite: torch sees no CUDA device (a CPU-only torch wheel?)" >&2; exit 4; }
fi
exec $PY benchmarks/gpu_suite.py "$@"
