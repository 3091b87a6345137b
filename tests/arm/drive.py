"""pytest on aarch64 under qemu-user, with the CPU feature flags named in ARM_FLAGS
(comma-separated /proc/cpuinfo names, e.g. `asimd,asimddp`): qemu-user shows the host's
/proc/cpuinfo, so the kernels' build would otherwise see no aarch64 features. Run by
tests/arm/run_under_qemu.sh; arguments go to pytest."""

import os
import sys

from radixflow.kernels import cpu_build

flags = set(os.environ["ARM_FLAGS"].split(","))
cpu_build.cpu_flags = lambda: flags

import pytest  # noqa: E402

sys.exit(pytest.main(sys.argv[1:]))
