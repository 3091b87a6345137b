"""examples/quickstart.py on the default model fits in 1 GiB of RAM: the peak resident set size
of its process, measured by the process itself (the one-time CPU kernel build's compiler is
not counted). It starts twice from an empty GGUF cache: the first start converts the GGUF, the
second loads the converted folder, as every later start does."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from radixflow.kernels.cpu_build import build_root

pytestmark = pytest.mark.slow

QUICKSTART = Path(__file__).resolve().parents[1] / "examples" / "quickstart.py"
GIB = 2**30
# Runs the quickstart as __main__, then prints its own peak RSS in bytes as the last line. On
# Linux from VmHWM: getrusage's ru_maxrss starts a forked-then-exec'd process at its parent's
# peak (here the whole test session's), VmHWM belongs to the process's own address space.
_RUN = (
    "import resource, runpy, sys\n"
    "runpy.run_path(sys.argv[1], run_name='__main__')\n"
    "if sys.platform == 'linux':\n"
    "    status = open('/proc/self/status').read().split('VmHWM:')[1]\n"
    "    print(int(status.split()[0]) * 1024)\n"
    "else:\n"
    "    print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)\n"  # bytes on macOS
)


def _peak_rss(cwd: Path, env: dict[str, str]) -> tuple[int, str]:
    done = subprocess.run(
        [sys.executable, "-c", _RUN, str(QUICKSTART)],
        cwd=cwd,  # not the checkout: its kernels/ folder would shadow Hugging Face's `kernels`
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    *lines, peak = done.stdout.strip().splitlines()
    return int(peak), "\n".join(lines)


def test_quickstart_peak_rss_under_1_gib(tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir()
    kernels = build_root()  # the built CPU kernels are shared: only the GGUF cache is fresh
    kernels.mkdir(parents=True, exist_ok=True)
    (cache / "cpu_kernels").symlink_to(kernels, target_is_directory=True)
    env = {**os.environ, "RADIXFLOW_CACHE_DIR": str(cache)}
    first, _ = _peak_rss(tmp_path, env)
    assert any((cache / "gguf").iterdir()), "the first start converted nothing"
    second, out = _peak_rss(tmp_path, env)
    assert out.count("\nA: ") == 3, out  # it answered its three questions
    figures = f"first start (converting) {first / 2**20:.0f} MiB, second {second / 2**20:.0f} MiB"
    assert first < GIB and second < GIB, figures
