"""Build and load the compiled CPU kernels (every kernels/cpu/*.cpp, one library) for the best
instruction set this CPU runs.

The kernels are one source written over a small vector abstraction (kernels/cpu/simd.h). The
ISA is chosen at run time from the CPU's features (/proc/cpuinfo flags on x86, the aarch64
architecture itself for NEON): AVX-512 (F, BW, VL, DQ; with AVX512-BF16, VNNI and AMX-INT8
where the CPU has them), else AVX2 + FMA + F16C, else NEON.
`RADIXFLOW_CPU_ISA=avx512|avx2|neon|none` forces one (a lower one on a better CPU is really that
ISA: the flags are explicit, never `-march=native`); an ISA the CPU cannot run falls back to the
best it can, with a warning.
`RADIXFLOW_CPU_WITHOUT=amx_int8` (CPU feature names, comma-separated) builds as for a CPU
without those features: the optional extensions' other code paths, on the same machine.

All sources are compiled together with torch's extension builder (ninja + the system C++
compiler, `-O3 -fopenmp` and the ISA's flags) into `$RADIXFLOW_CACHE_DIR/cpu_kernels` (default
`~/.cache/radixflow/cpu_kernels`), in a folder named for the ISA and keyed by the sources, the
flags and the torch version; later processes only load the built library. One library loads
per process; its ops register as `torch.ops.radixflow_cpu.*`. Processes building at once take
turns on an OS file lock, which a killed process drops (torch's own lock file would outlive it
and make every later start wait forever, so it is cleared while that lock is held). When no ISA
applies or the build fails, `cpu_kernels_available()` is False, one warning says why, and
callers keep their torch path; `loaded().describe()` names the ISA or the reason for the
startup log.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import logging
import os
import platform
import subprocess
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

from radixflow.cache import cache_dir

logger = logging.getLogger(__name__)

SOURCES = tuple(sorted((Path(__file__).parent / "cpu").glob("*.cpp")))
HEADERS = tuple(sorted((Path(__file__).parent / "cpu").glob("*.h")))
BASE_CFLAGS = ("-O3", "-fopenmp")
LDFLAGS = ("-fopenmp",)
LIBRARY = "radixflow_cpu_kernels"
ISA_ENV = "RADIXFLOW_CPU_ISA"
WITHOUT_ENV = "RADIXFLOW_CPU_WITHOUT"


@dataclass(frozen=True)
class Isa:
    """An instruction set the kernels compile for: the CPU features it needs and the flags."""

    name: str
    arch: str  # "x86_64" or "aarch64"
    needs: frozenset[str]
    cflags: tuple[str, ...]
    # optional extensions: CPU feature -> compiler flag (used when the CPU has them)
    extras: tuple[tuple[str, str], ...] = ()


ISAS = (  # best first
    Isa(
        "avx512",
        "x86_64",
        frozenset({"avx512f", "avx512bw", "avx512vl", "avx512dq", "fma", "f16c"}),
        ("-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq", "-mfma", "-mf16c"),
        (
            ("avx512_bf16", "-mavx512bf16"),
            ("avx512_vnni", "-mavx512vnni"),
            # AMX tiles for the int8-activation matmul (kernels/cpu/amx_int8.h): both needed
            ("amx_tile", "-mamx-tile"),
            ("amx_int8", "-mamx-int8"),
        ),
    ),
    Isa("avx2", "x86_64", frozenset({"avx2", "fma", "f16c"}), ("-mavx2", "-mfma", "-mf16c")),
    # NEON (asimd) is part of every aarch64 CPU: the compiler's default target has it; SDOT
    # (asimddp: Graviton 2+, Apple M1+) speeds up the int8-activation matmul.
    Isa("neon", "aarch64", frozenset(), (), (("asimddp", "-march=armv8.2-a+dotprod"),)),
)
ISA_NAMES = tuple(isa.name for isa in ISAS)


def build_root() -> Path:
    """`$RADIXFLOW_CACHE_DIR/cpu_kernels`, or `~/.cache/radixflow/cpu_kernels`."""
    return cache_dir("cpu_kernels")


def cpu_arch() -> str:
    """`x86_64`, `aarch64` (Linux `aarch64` and macOS `arm64` alike) or the machine's own name."""
    machine = platform.machine().lower()
    return {"amd64": "x86_64", "arm64": "aarch64"}.get(machine, machine)


def cpu_flags() -> set[str]:
    """This CPU's feature flags from /proc/cpuinfo (x86 `flags`, aarch64 `Features`); on macOS
    the Linux names of what `sysctl hw.optional.arm` reports; empty when unreadable."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return macos_arm_flags()
    for line in text.splitlines():
        if line.startswith(("flags", "Features")):
            return set(line.split(":", 1)[1].split())
    return set()


# macOS sysctl hw.optional.arm.<feature> -> the Linux /proc/cpuinfo name of that feature
MACOS_ARM_FEATURES = {"FEAT_DotProd": "asimddp", "FEAT_BF16": "bf16"}


def macos_arm_flags() -> set[str]:
    """The features of MACOS_ARM_FEATURES that this Mac reports as present (empty elsewhere)."""
    if platform.system() != "Darwin":
        return set()
    flags = set()
    for feature, name in MACOS_ARM_FEATURES.items():
        try:
            found = subprocess.run(
                ["sysctl", "-n", f"hw.optional.arm.{feature}"],
                capture_output=True,
                text=True,
                timeout=5,
            )
        except (OSError, subprocess.SubprocessError):
            continue
        if found.stdout.strip() == "1":
            flags.add(name)
    return flags


def runs(isa: Isa, arch: str, flags: set[str]) -> bool:
    """Whether a CPU of this architecture and feature flags runs code built for `isa`."""
    return isa.arch == arch and isa.needs <= flags


@dataclass(frozen=True)
class Choice:
    """The ISA to build for (None: the torch path) and why, in words for the log."""

    isa: Isa | None
    flags: tuple[str, ...]  # the ISA's compiler flags, extensions included
    reason: str
    fell_back: bool = False  # RADIXFLOW_CPU_ISA asked for an ISA this CPU cannot run


def choose_isa(arch: str, flags: set[str], requested: str | None) -> Choice:
    """The best ISA this CPU runs, or the requested one (`RADIXFLOW_CPU_ISA`) when it runs it;
    a requested ISA it cannot run gives the best it can, the reason saying so."""
    requested = (requested or "").strip().lower() or None
    if requested not in (None, "auto", "none", *ISA_NAMES):
        raise ValueError(
            f"{ISA_ENV}={requested!r} is not one of auto, none, {', '.join(ISA_NAMES)}"
        )
    if requested == "none":
        return Choice(None, (), f"{ISA_ENV}=none")
    usable = [isa for isa in ISAS if runs(isa, arch, flags)]
    forced = next((isa for isa in usable if isa.name == requested), None)
    if forced is not None:
        return Choice(forced, _flags(forced, flags), f"forced by {ISA_ENV}")
    why = ""
    if requested not in (None, "auto"):
        wanted = next(isa for isa in ISAS if isa.name == requested)
        lacks = sorted(wanted.needs - flags) if wanted.arch == arch else [wanted.arch]
        why = f"{ISA_ENV}={requested} but this {arch} CPU lacks {', '.join(lacks)}; "
    if not usable:
        need = "; ".join(f"{isa.name}: {isa.arch} {' '.join(sorted(isa.needs))}" for isa in ISAS)
        return Choice(None, (), f"{why}this {arch} CPU runs none of ({need})", bool(why))
    best = usable[0]
    if why:
        return Choice(best, _flags(best, flags), f"{why}using {best.name}", fell_back=True)
    return Choice(best, _flags(best, flags), "the best this CPU runs")


def _flags(isa: Isa, flags: set[str]) -> tuple[str, ...]:
    return isa.cflags + tuple(flag for feature, flag in isa.extras if feature in flags)


def runnable_isas() -> list[str]:
    """The ISAs this CPU runs, best first (each can be forced with `RADIXFLOW_CPU_ISA`)."""
    arch, flags = cpu_arch(), cpu_flags()
    return [isa.name for isa in ISAS if runs(isa, arch, flags)]


# CPU features with which bfloat16 matmuls beat float32 (AVX512-BF16's VDPBF16PS, AMX tiles,
# Arm's BFMMLA/BFDOT); without them bf16 is emulated, slower than fp32 (docs/benchmarks.md).
FAST_BF16 = {"x86_64": frozenset({"avx512_bf16", "amx_bf16"}), "aarch64": frozenset({"bf16"})}


def fast_bf16(arch: str | None = None, flags: set[str] | None = None) -> bool:
    """Whether this CPU (or the one given) runs bfloat16 matmuls faster than float32."""
    arch = arch or cpu_arch()
    flags = cpu_flags() if flags is None else flags
    return bool(FAST_BF16.get(arch, frozenset()) & flags)


def current_choice() -> Choice:
    """`choose_isa` for this CPU, less the features `RADIXFLOW_CPU_WITHOUT` names, and this
    process's `RADIXFLOW_CPU_ISA`."""
    return choose_isa(cpu_arch(), cpu_flags() - features_left_out(), os.environ.get(ISA_ENV))


def features_left_out() -> set[str]:
    """The CPU features `RADIXFLOW_CPU_WITHOUT` names (comma-separated /proc/cpuinfo names,
    e.g. `amx_int8` or `avx512_vnni`): the library is built as for a CPU without them."""
    return {name.strip() for name in os.environ.get(WITHOUT_ENV, "").split(",") if name.strip()}


def build_folder(root: Path, choice: Choice | None = None) -> Path:
    """The folder under `root` for these sources, the ISA's flags and the torch version."""
    choice = choice or current_choice()
    name = choice.isa.name if choice.isa else "none"
    key = b"|".join(
        [path.name.encode() + b"\0" + path.read_bytes() for path in SOURCES + HEADERS]
        + [" ".join(BASE_CFLAGS + choice.flags + LDFLAGS).encode(), torch.__version__.encode()]
    )
    return root / f"kernels-{name}-{hashlib.sha256(key).hexdigest()[:16]}"


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


@dataclass(frozen=True)
class Loaded:
    """What this process runs: the ISA of the loaded library (None: the torch path) and why."""

    isa: str | None
    flags: tuple[str, ...]
    reason: str

    @property
    def bf16_dot(self) -> bool:
        """The library uses AVX512-BF16's VDPBF16PS for bfloat16 products."""
        return "-mavx512bf16" in self.flags

    def describe(self) -> str:
        """`avx512+bf16+vnni`, `avx2`, `neon+asimddp`, or `off (why)`: for the startup log."""
        if self.isa is None:
            return f"off ({self.reason})"
        extras = [_EXTRA_NAMES[flag] for flag in self.flags if flag in _EXTRA_NAMES]
        return "+".join([self.isa, *extras])


# an optional extension's compiler flag -> its name in the log (the CPU feature's)
_EXTRA_NAMES = {
    flag: feature.removeprefix("avx512_") for isa in ISAS for feature, flag in isa.extras
}


def build(root: Path | None = None, choice: Choice | None = None) -> Loaded:
    """Compile (or reuse) and load the kernel library for `choice` (default: this CPU's and
    `RADIXFLOW_CPU_ISA`'s); when it cannot, the result's isa is None and one warning says why."""
    choice = choice or current_choice()
    if choice.isa is None:
        return _off(choice.reason)
    if choice.fell_back:
        warnings.warn(f"radixflow: {choice.reason}", RuntimeWarning, stacklevel=2)
    folder = build_folder(root or build_root(), choice)
    try:
        from torch.utils.cpp_extension import load

        folder.mkdir(parents=True, exist_ok=True)
        with _build_lock(folder):
            load(
                name=f"{LIBRARY}_{choice.isa.name}",
                sources=[str(path) for path in SOURCES],
                extra_cflags=[*BASE_CFLAGS, *choice.flags],
                extra_ldflags=list(LDFLAGS),
                build_directory=str(folder),
                is_python_module=False,
                verbose=False,
            )
    except Exception as exc:  # no compiler, no ninja, a failed build: keep the torch path
        detail = str(exc).strip()
        last = detail.splitlines()[-1] if detail else repr(exc)
        return _off(f"could not build the {choice.isa.name} kernels ({type(exc).__name__}: {last})")
    loaded = Loaded(choice.isa.name, _granted(choice.flags), choice.reason)
    logger.info("radixflow CPU kernels: %s (%s)", loaded.describe(), choice.reason)
    return loaded


AMX_FLAGS = ("-mamx-tile", "-mamx-int8")


def amx_granted() -> bool:
    """Whether the loaded library runs its int8 matmul on AMX tiles in this process (built
    with AMX, and Linux granted the tile state)."""
    return bool(torch.ops.radixflow_cpu.amx_tiles())


def _granted(flags: tuple[str, ...]) -> tuple[str, ...]:
    """`flags` without AMX's where the library does not run tiles: built with one of the two
    only (`RADIXFLOW_CPU_WITHOUT`), or Linux refuses this process the tile state (the library
    then runs the AVX-512 int8 kernels; one warning says so)."""
    present = set(AMX_FLAGS) & set(flags)
    if not present or (present == set(AMX_FLAGS) and amx_granted()):
        return flags
    if present == set(AMX_FLAGS):
        warnings.warn(
            "radixflow: this CPU has AMX but Linux refused this process the tile state "
            "(arch_prctl ARCH_REQ_XCOMP_PERM); the int8 matmul runs on AVX-512",
            RuntimeWarning,
            stacklevel=3,
        )
    return tuple(flag for flag in flags if flag not in AMX_FLAGS)


def _off(reason: str) -> Loaded:
    warnings.warn(
        f"radixflow: the CPU kernels are off ({reason}); the torch path is used",
        RuntimeWarning,
        stacklevel=3,
    )
    return Loaded(None, (), reason)


@functools.cache
def loaded() -> Loaded:
    """The library this process runs (built or loaded on the first call of the process)."""
    return build()


def cpu_kernels_available() -> bool:
    """True when the compiled library is loaded (built on the first call of the process)."""
    return loaded().isa is not None
