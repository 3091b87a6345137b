"""pytest with the CPU feature flags named in CPU_FLAGS (comma-separated /proc/cpuinfo names,
e.g. `asimd,asimddp`) instead of the CPU's own: on aarch64 under qemu-user, which shows the
host's /proc/cpuinfo (tests/arm/run_under_qemu.sh). Arguments go to pytest."""

import os
import sys

from radixflow.kernels import cpu_build

flags = set(os.environ["CPU_FLAGS"].split(","))
cpu_build.cpu_flags = lambda: flags

import pytest  # noqa: E402

sys.exit(pytest.main(sys.argv[1:]))
