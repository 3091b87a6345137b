"""Build and load the compiled CPU kernels (every kernels/cpu/*.cpp, one library).

All sources are compiled together with torch's extension builder (ninja + the system C++
compiler, `-O3 -march=native -fopenmp`) into `$RADIXFLOW_CACHE_DIR/cpu_kernels` (default
`~/.cache/radixflow/cpu_kernels`), in a folder keyed by the sources, the flags, the torch
version and this CPU's instruction-set flags; later processes only load the built library. The
ops register as `torch.ops.radixflow_cpu.*`. Processes building at once take turns on an OS
file lock, which a killed process drops (torch's own lock file would outlive it and make every
later start wait forever, so it is cleared while that lock is held). When the CPU lacks AVX-512 or the build fails,
`cpu_kernels_available()` is False, one warning says why, and callers keep their torch path.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import platform
import warnings
from collections.abc import Iterator
from pathlib import Path

import torch

SOURCES = tuple(sorted((Path(__file__).parent / "cpu").glob("*.cpp")))
HEADERS = tuple(sorted((Path(__file__).parent / "cpu").glob("*.h")))
# Tuples: torch's builder appends to the flag lists it is given.
CFLAGS = ("-O3", "-march=native", "-fopenmp")
LDFLAGS = ("-fopenmp",)
LIBRARY = "radixflow_cpu_kernels"


def build_root() -> Path:
    """`$RADIXFLOW_CACHE_DIR/cpu_kernels`, or `~/.cache/radixflow/cpu_kernels`."""
    base = os.environ.get("RADIXFLOW_CACHE_DIR")
    return (Path(base) if base else Path.home() / ".cache" / "radixflow") / "cpu_kernels"


def cpu_flags() -> set[str]:
    """This CPU's instruction-set flags from /proc/cpuinfo (empty when unreadable)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    for line in text.splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


def cpu_supported() -> bool:
    """Whether this CPU can run the kernels (x86-64 with AVX-512F)."""
    return platform.machine() in ("x86_64", "AMD64") and "avx512f" in cpu_flags()


def build_folder(root: Path) -> Path:
    """The folder under `root` for these sources, flags, torch version and CPU."""
    key = b"|".join(
        [path.name.encode() + b"\0" + path.read_bytes() for path in SOURCES + HEADERS]
        + [" ".join(CFLAGS + LDFLAGS).encode(), torch.__version__.encode()]
        + [" ".join(sorted(cpu_flags())).encode()]
    )
    return root / f"kernels-{hashlib.sha256(key).hexdigest()[:16]}"


@contextlib.contextmanager
def _build_lock(folder: Path) -> Iterator[None]:
    """Hold an OS lock on `folder` (released by the OS if this process dies) and clear a lock
    file torch's builder left behind in it: a live builder would hold ours first."""
    try:
        import fcntl
    except ImportError:  # not POSIX: torch's own lock file is all there is
        yield
        return
    with open(folder / "radixflow.lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            (folder / "lock").unlink(missing_ok=True)
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def build(root: Path | None = None) -> bool:
    """Compile (or reuse) and load the kernel library; False, with a warning, when it cannot."""
    if not cpu_supported():
        warnings.warn(
            "radixflow: this CPU has no AVX-512; the CPU kernels are off and the torch path is used",
            RuntimeWarning,
            stacklevel=2,
        )
        return False
    folder = build_folder(root or build_root())
    try:
        from torch.utils.cpp_extension import load

        folder.mkdir(parents=True, exist_ok=True)
        with _build_lock(folder):
            load(
                name=LIBRARY,
                sources=[str(path) for path in SOURCES],
                extra_cflags=list(CFLAGS),
                extra_ldflags=list(LDFLAGS),
                build_directory=str(folder),
                is_python_module=False,
                verbose=False,
            )
    except Exception as exc:  # no compiler, no ninja, a failed build: keep the torch path
        detail = str(exc).strip()
        warnings.warn(
            f"radixflow: could not build the CPU kernels ({type(exc).__name__}: "
            f"{detail.splitlines()[-1] if detail else repr(exc)}); the torch path is used",
            RuntimeWarning,
            stacklevel=2,
        )
        return False
    return True


@functools.cache
def cpu_kernels_available() -> bool:
    """True when the compiled library is loaded (built on the first call of the process)."""
    return build()
