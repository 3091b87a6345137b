#!/usr/bin/env bash
# The CPU kernels' NEON paths (Apple Silicon, Graviton) on an x86 machine: an aarch64 Python,
# torch and radixflow run under qemu-user, and the kernel tests run twice, with the dot-product
# extension (SDOT) and without it (widening multiplies). The kernels are cross-compiled by the
# host's aarch64 g++ (qemu-user runs host binaries natively). `make arm-check` runs this.
#
# Needs (Debian, as root):  dpkg --add-architecture arm64 && apt-get update &&
#                           apt-get install qemu-user-static g++-aarch64-linux-gnu
# The aarch64 Python comes from Debian's arm64 packages (apt-get download, unpacked into
# build/arm/root), its packages from PyPI's aarch64 wheels (build/arm/site; torch's CPU build
# for aarch64, $ARM_TORCH).
set -euo pipefail
cd "$(dirname "$0")/../.."
ARM=build/arm
ARM_TORCH=${ARM_TORCH:-torch==2.9.1}  # the newest aarch64 wheel on PyPI without CUDA
PIP=".venv/bin/python -m pip"
for tool in qemu-aarch64-static aarch64-linux-gnu-g++; do
  command -v $tool >/dev/null || { echo "$tool is missing: see the header of $0" >&2; exit 2; }
done
if [ ! -x $ARM/root/usr/bin/python3.11 ]; then
  mkdir -p $ARM/debs $ARM/root
  (cd $ARM/debs && apt-get download python3.11-minimal:arm64 libpython3.11-minimal:arm64 \
    libpython3.11-stdlib:arm64 libpython3.11-dev:arm64 libc6:arm64 zlib1g:arm64 \
    libexpat1:arm64 libffi8:arm64 libssl3:arm64 libbz2-1.0:arm64 liblzma5:arm64 \
    libsqlite3-0:arm64 libncursesw6:arm64 libtinfo6:arm64 libreadline8:arm64 libuuid1:arm64 \
    libgcc-s1:arm64 libstdc++6:arm64 libgomp1:arm64 libcrypt1:arm64 libzstd1:arm64)
  for deb in $ARM/debs/*.deb; do dpkg-deb -x "$deb" $ARM/root; done
fi
PLATFORMS=""
for tag in manylinux_2_28 manylinux_2_27 manylinux_2_26 manylinux_2_24 manylinux_2_17 manylinux2014; do
  PLATFORMS="$PLATFORMS --platform ${tag}_aarch64"
done
if [ ! -d $ARM/site/torch ]; then
  $PIP install --quiet --no-warn-conflicts --target $ARM/site $PLATFORMS --only-binary=:all: --python-version 3.11 \
    --implementation cp --no-deps "$ARM_TORCH"
  $PIP install --quiet --no-warn-conflicts --target $ARM/site $PLATFORMS --only-binary=:all: --python-version 3.11 \
    --implementation cp "transformers>=5.0" huggingface_hub safetensors gguf numpy tqdm lark \
    regex fastapi starlette pydantic uvicorn httpx prometheus_client swagger-ui-py jinja2 \
    pytest pytest-asyncio hypothesis jsonschema ninja setuptools filelock sympy networkx fsspec \
    typing_extensions
fi
rm -rf $ARM/wheel $ARM/site/radixflow $ARM/site/radixflow-*.dist-info
$PIP wheel --quiet --no-deps . -w $ARM/wheel
$PIP install --quiet --no-warn-conflicts --no-deps --target $ARM/site $ARM/wheel/radixflow-*.whl
TESTS=${*:-tests/test_kernels_quant.py tests/test_kernels_cpu_linear.py tests/test_kernels_cpu_attention.py tests/test_kernels_cpu_elementwise.py tests/test_decode_layer.py}
status=0
for flags in asimd,asimddp asimd; do
  echo "== aarch64 under qemu, CPU features: $flags"
  # ninja and the cross compiler are host binaries; the kernels build into $ARM/cache
  PATH="$PWD/.venv/bin:$PATH" CXX=aarch64-linux-gnu-g++ CC=aarch64-linux-gnu-gcc \
    RADIXFLOW_CACHE_DIR=$ARM/cache PYTHONPATH=$ARM/site CPU_FLAGS=$flags \
    qemu-aarch64-static -L $ARM/root $ARM/root/usr/bin/python3.11 -P tests/arm/drive.py \
    -q -p no:cacheprovider $TESTS || status=1
done
exit $status
