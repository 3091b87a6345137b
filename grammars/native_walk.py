"""The trie walk in C (`trie_walk.c`), built on first use, with the numpy walk as its twin.

The numpy walk (`masks`) goes one trie depth at a time, a dozen array calls per depth; the C
walk goes depth-first and skips a dead node's subtree in one step, so a mask costs about the
nodes it reaches alive. The C walk reads the automaton's rows where they are kept (through
`row_pointers()`, no copy): it hands back the nodes whose parent's row is not computed yet,
Python computes those rows and hands the nodes back, one round per level of new rows.

The source is compiled once per machine with the system C compiler (`$CC`, else `cc`, `gcc`
or `clang`; `-O2`, no CPU-specific flags) into `$RADIXFLOW_CACHE_DIR/grammar_native` (default
`~/.cache/radixflow/grammar_native`), named for a hash of the source, the compiler and the
architecture; it is written under a temporary name and renamed into place, so processes
building at once never load half a file. Without a compiler, or when the build fails, one
warning says why and masks use the numpy walk; `RADIXFLOW_GRAMMAR_NATIVE=0` chooses the numpy
walk. `describe()` says which walk is in use.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import uuid
import warnings
import weakref
from collections.abc import Callable
from pathlib import Path

import numpy as np

from radixflow.cache import cache_dir

from .automaton import ByteAutomaton
from .tokenizer_index import TokenizerIndex

logger = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("trie_walk.c")
NATIVE_ENV = "RADIXFLOW_GRAMMAR_NATIVE"
CFLAGS = ("-O2", "-shared", "-fPIC")
BUILD_TIMEOUT_S = 120
_P = ctypes.c_void_p
_ARGTYPES = (_P, ctypes.c_int64, _P, _P, ctypes.c_int64, _P, _P)


def compiler() -> str | None:
    """The C compiler to build with: `$CC`, else the first of cc, gcc, clang on PATH."""
    if os.environ.get("CC"):
        return os.environ["CC"]
    return next((c for c in ("cc", "gcc", "clang") if shutil.which(c)), None)


def _build(cc: str) -> Path:
    """Path of the compiled library, building it when this machine has not yet."""
    ident = SOURCE.read_bytes() + f"|{cc}|{' '.join(CFLAGS)}|{platform.machine()}".encode()
    folder = cache_dir("grammar_native")
    lib = folder / f"trie_walk-{hashlib.sha256(ident).hexdigest()[:16]}.so"
    if lib.exists():
        return lib
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / f".{lib.name}.{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        subprocess.run(
            [cc, *CFLAGS, "-o", str(tmp), str(SOURCE)],
            check=True,
            capture_output=True,
            text=True,
            timeout=BUILD_TIMEOUT_S,
        )
        os.replace(tmp, lib)
    finally:
        tmp.unlink(missing_ok=True)
    return lib


@functools.cache
def trie_walk() -> Callable[..., int] | None:
    """The C walk, or None (the numpy walk) with the reason logged or warned once."""
    if os.environ.get(NATIVE_ENV, "1") == "0":
        logger.info("grammar masks: numpy trie walk (%s=0)", NATIVE_ENV)
        return None
    cc = compiler()
    if cc is None:
        warnings.warn(
            "no C compiler found (set CC, or install cc/gcc/clang): grammar masks use the "
            "slower numpy trie walk",
            stacklevel=2,
        )
        return None
    try:
        fn = ctypes.CDLL(str(_build(cc))).rf_trie_walk
    except subprocess.CalledProcessError as exc:
        reason = f"{cc} failed: {(exc.stderr or '').strip()[-500:]}"
    except (OSError, subprocess.TimeoutExpired) as exc:
        reason = f"{type(exc).__name__}: {exc}"
    else:
        fn.argtypes = _ARGTYPES
        fn.restype = ctypes.c_int64
        logger.info("grammar masks: native trie walk (%s)", SOURCE.name)
        return fn
    warnings.warn(
        f"building the native grammar trie walk failed ({reason}); grammar masks use the "
        "slower numpy trie walk",
        stacklevel=2,
    )
    return None


def describe() -> str:
    """Which trie walk masks use, for the startup log."""
    return "native trie walk" if trie_walk() is not None else "numpy trie walk"


class _Trie(ctypes.Structure):
    """`struct trie` of trie_walk.c: the index's preorder arrays."""

    _fields_ = [
        ("byte", _P),
        ("depth", _P),
        ("size", _P),
        ("token", _P),
        ("max_depth", ctypes.c_int64),
    ]


_TRIES: dict[int, _Trie] = {}


def _trie(index: TokenizerIndex) -> _Trie:
    """The `struct trie` of `index`, made once and dropped with the index."""
    got = _TRIES.get(id(index))
    if got is None:
        got = _Trie(
            *(
                a.ctypes.data
                for a in (
                    index.pre_byte,
                    index.pre_depth,
                    index.pre_size,
                    index.pre_token,
                )
            ),
            index.depth_start.shape[0] - 2,
        )
        _TRIES[id(index)] = got
        weakref.finalize(index, _TRIES.pop, id(index), None)
    return got


def native_mask(
    fn: Callable[..., int], index: TokenizerIndex, automaton: ByteAutomaton, state: int
) -> np.ndarray:
    """Packed int32[num_words] mask of the tokens whose bytes `state` reads, one per trie node
    (`index.pre_token`: EOS and tokens that repeat a lower token's bytes not added), by the C
    walk `fn` over the automaton's rows (computing those it reaches first)."""
    trie = _trie(index)
    words = np.zeros(index.num_words + 1, dtype=np.uint32)  # the last: nodes without a token
    first_pending = trie.max_depth + 1
    scratch = np.empty(first_pending + 2 * index.num_nodes, dtype=np.int32)
    roots = np.array([0, state], dtype=np.int32)  # (node, parent's state) pairs
    out = (scratch.ctypes.data, words.ctypes.data)
    while True:
        rows = automaton.row_pointers()  # held while the walk reads it (growth replaces it)
        pending = fn(
            rows.ctypes.data,
            rows.shape[0],
            ctypes.addressof(trie),
            roots.ctypes.data,
            roots.shape[0] // 2,
            *out,
        )
        if not pending:
            break
        roots = scratch[first_pending : first_pending + 2 * pending].copy()
        for parent in set(roots[1::2].tolist()):
            automaton.row(parent)
    return words[:-1].view(np.int32)
