#!/usr/bin/env bash
# Everything radixflow checks on a CUDA GPU, in one run: the GPU tests (tests/test_gpu.py:
# the Triton kernels compiled for the device, the engine end to end on the GPU) and the kernel
# table of benchmarks/kernels_gpu.py. Meant for a lent GPU machine without a network: the
# wheels in $WHEELS (radixflow's own and the dependencies the machine lacks, made beforehand
# with `pip wheel --no-deps . -w $WHEELS` and `pip download ... -d $WHEELS`) are installed
# over the machine's torch, triton and transformers.
#
#     WHEELS=.gpuwheels OUT=/tmp/out bash benchmarks/gpu_check.sh
set -uo pipefail
WHEELS=${WHEELS:-.gpuwheels}
OUT=${OUT:-/tmp/radixflow-gpu}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
python -c "import sys, torch, triton, transformers; print(sys.version.split()[0], 'torch', torch.__version__, 'triton', triton.__version__, 'transformers', transformers.__version__)"
python -m pip install -q --no-index --find-links "$WHEELS" "$WHEELS"/radixflow-*.whl pytest pytest-asyncio hypothesis jsonschema 2>&1 | tail -3
export TRITON_INTERPRET=0 PYTHONUNBUFFERED=1
python -P -m pytest -q -p no:cacheprovider tests/test_gpu.py --durations=10 2>&1 | tee "$OUT/test_gpu.log"
timeout "${KERNELS_TIMEOUT:-240}" python -P benchmarks/kernels_gpu.py 2>&1 | tee "$OUT/kernels_gpu.log"
