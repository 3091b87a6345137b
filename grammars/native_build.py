"""Grammar code in C, built on first use with the system C compiler: the trie walk
(`native_walk`, a plain library loaded through ctypes), and as Python extension modules
(`load_extension`) the lazy DFA's rows with the NFA states they make and the walk's row
callback (`native_rows`), a JSON Schema's canonical copy and structure numbers
(`json_schema_resolve.schema_doc`) and regex derivatives with the product automaton's loop
(`regex_terms.regex_derivs`). Each has its Python twin, which runs where the C is not built.

A source is compiled once per machine (`$CC`, else `cc`, `gcc` or `clang`; `-O3`, whose
vectorizer takes loops such as the walk's or-ing of packed rows that `-O2` leaves scalar, and
no CPU-specific flags) into `$RADIXFLOW_CACHE_DIR/grammar_native` (default
`~/.cache/radixflow/grammar_native`), named for a hash of the source, the flags, the compiler
and the architecture; it is written under a temporary name and renamed into place, so
processes building at once never load half a file. Without a compiler, or when a build or load
fails, one warning says why and the Python twin runs; `RADIXFLOW_GRAMMAR_NATIVE=0` chooses the
twins for all of it.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.machinery
import importlib.util
import logging
import os
import platform
import shutil
import subprocess
import sys
import sysconfig
import warnings
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import TypeVar

from radixflow.cache import cache_dir, temporary_beside

logger = logging.getLogger(__name__)

NATIVE_ENV = "RADIXFLOW_GRAMMAR_NATIVE"
CFLAGS = ("-O3", "-shared", "-fPIC")
BUILD_TIMEOUT_S = 120
T = TypeVar("T")


def compiler() -> str | None:
    """The C compiler to build with: `$CC`, else the first of cc, gcc, clang on PATH."""
    if os.environ.get("CC"):
        return os.environ["CC"]
    return next((c for c in ("cc", "gcc", "clang") if shutil.which(c)), None)


def build(source: Path, cc: str, flags: tuple[str, ...] = ()) -> Path:
    """Path of `source` compiled as a shared library, building it when this machine has not."""
    args = (*CFLAGS, *flags)
    ident = source.read_bytes() + f"|{cc}|{' '.join(args)}|{platform.machine()}".encode()
    folder = cache_dir("grammar_native")
    lib = folder / f"{source.stem}-{hashlib.sha256(ident).hexdigest()[:16]}.so"
    if lib.exists():
        return lib
    folder.mkdir(parents=True, exist_ok=True)
    tmp = temporary_beside(lib)
    try:
        subprocess.run(
            [cc, *args, "-o", str(tmp), str(source)],
            check=True,
            capture_output=True,
            text=True,
            timeout=BUILD_TIMEOUT_S,
        )
        os.replace(tmp, lib)
    finally:
        tmp.unlink(missing_ok=True)
    return lib


def load_native(
    what: str,
    fallback: str,
    source: Path,
    load: Callable[[Path], T],
    flags: tuple[str, ...] = (),
) -> T | None:
    """`load` of `source` built (see `build`), or None when the environment, the compiler, the
    build or the load says no: logged, or warned with the reason ("building the native
    `what` failed (...); `fallback`")."""
    if os.environ.get(NATIVE_ENV, "1") == "0":
        logger.info("%s: off (%s=0)", what, NATIVE_ENV)
        return None
    cc = compiler()
    if cc is None:
        warnings.warn(
            f"no C compiler found (set CC, or install cc/gcc/clang): {fallback}", stacklevel=3
        )
        return None
    try:
        got = load(build(source, cc, flags))
    except subprocess.CalledProcessError as exc:
        reason = f"{cc} failed: {(exc.stderr or '').strip()[-500:]}"
    except (OSError, ImportError, subprocess.TimeoutExpired) as exc:
        reason = f"{type(exc).__name__}: {exc}"
    else:
        logger.info("%s: native (%s)", what, source.name)
        return got
    warnings.warn(f"building the native {what} failed ({reason}); {fallback}", stacklevel=3)
    return None


def _import_extension(name: str, lib: Path) -> ModuleType:
    loader = importlib.machinery.ExtensionFileLoader(name, str(lib))
    spec = importlib.util.spec_from_file_location(name, lib, loader=loader)
    if spec is None:
        raise ImportError(f"cannot load {lib}")
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def load_extension(what: str, fallback: str, source: Path) -> ModuleType | None:
    """The Python extension module written in `source` (named for its file) built and
    imported, or None as `load_native` says. Building it needs the interpreter's C headers
    (`sysconfig`'s include path)."""
    # The include path names the Python version, which the build's hash covers; macOS links
    # an extension's Python symbols when it is loaded, not when it is built.
    flags = (f"-I{sysconfig.get_paths()['include']}",)
    if sys.platform == "darwin":
        flags += ("-undefined", "dynamic_lookup")
    load = functools.partial(_import_extension, source.stem)
    return load_native(what, fallback, source, load, flags)
