#!/usr/bin/env bash
# make gpu-check: what only a CUDA machine can check, in one command (about 10 minutes on one GPU).
#
#   1. install: from the wheels in wheels/ when there are any (a GPU node with no package index; fill it on a
#      machine with one, see docs/gpu-check.md), else from the index; the project itself runs from this folder;
#   2. the tests marked gpu (tests/test_gpu.py): the engine against the training forward in fp32 and bf16, the
#      isolated and tree forwards on CUDA against the CPU, one bf16 SFT and GRPO step of the tiny recipes, the tag
#      rows' float32 copy under fused AdamW, and colocated vLLM in its real sleep mode where the node has vLLM;
#   3. the rollout benchmark on CUDA (13M and Qwen3-4B shapes), and the training-forward memory benchmark at 4096
#      tokens on a randomly initialised model of the Qwen3-4B shape in bf16.
# Results: benchmarks/results/gpu-tests.txt, gpu-rollout.md, gpu-rollout-4b.md, gpu-structures.md
# (GPU_CHECK_RESULTS names another folder). PYTHON picks the interpreter (default: python3, which should hold a
# CUDA build of torch); GPU_CHECK_INSTALL=0 installs nothing.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
RESULTS=${GPU_CHECK_RESULTS:-benchmarks/results}

if [ "${GPU_CHECK_INSTALL:-1}" = 0 ]; then
    echo "== using $PYTHON as it is (GPU_CHECK_INSTALL=0)"
elif compgen -G "wheels/*.whl" > /dev/null; then
    echo "== installing from wheels/ (no index; the node's own torch, CUDA and triton are kept)"
    "$PYTHON" -m pip install --quiet --no-index --find-links wheels \
        $(ls wheels/*.whl | grep -v -E '/(torch|nvidia_|triton)[-_]')
else
    echo "== installing the project's dependencies from the package index"
    "$PYTHON" -m pip install --quiet -e ".[dev]"
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

"$PYTHON" - <<'EOF'
import sys

import torch

if not torch.cuda.is_available():
    sys.exit(f"error: no CUDA device is visible to torch {torch.__version__}; make gpu-check needs one")
print(f"== {torch.cuda.get_device_name()} (torch {torch.__version__}, CUDA {torch.version.cuda})")
EOF

echo "== tests marked gpu"
set +e
"$PYTHON" -m pytest -m gpu -p no:cacheprovider -rA tests/test_gpu.py 2>&1 | tee "$RESULTS/gpu-tests.txt"
tests=${PIPESTATUS[0]}
set -e

echo "== rollout benchmark on CUDA: 13M shape, then the Qwen3-4B shape (random weights, bf16)"
timeout 300 "$PYTHON" benchmarks/bench_rollout.py --device cuda --dtype bfloat16 --backends transformers \
    --shape 13m --out "$RESULTS/gpu-rollout.md"
timeout 420 "$PYTHON" benchmarks/bench_rollout.py --device cuda --dtype bfloat16 --backends transformers \
    --shape qwen3-4b --batches 8 64 --out "$RESULTS/gpu-rollout-4b.md"

echo "== training-forward memory at 4096 tokens, Qwen3-4B shape, bf16"
timeout 300 "$PYTHON" benchmarks/bench_structures.py --device cuda --shape qwen3-4b --dtype bfloat16 \
    --lengths 4096 --batch 1 --flex --skip-vllm --out "$RESULTS/gpu-structures.md"

echo "== results: $RESULTS/gpu-tests.txt, $RESULTS/gpu-rollout.md, $RESULTS/gpu-rollout-4b.md, $RESULTS/gpu-structures.md"
exit "$tests"
