"""The lazy DFA's closures and rows in C (`dfa_rows.c`, a Python extension module built on
first use, see `native_build`), with `nfa.LazyDFA`'s Python code as its twin.

A new row is two loops over the NFA's made lists (the closure of each target set, the sweep
of the row's byte edges) and a callback into Python for what the NFA has not made yet; the C
module runs the loops on the same lists and dicts and calls the same Python methods, so the
automaton (its states, their numbers, every row) is the same either way. Building it needs
the interpreter's C headers (`sysconfig`'s include path); without them the twin runs.
"""

from __future__ import annotations

import functools
import importlib.machinery
import importlib.util
import sys
import sysconfig
from pathlib import Path
from types import ModuleType

from .native_build import load_native

SOURCE = Path(__file__).with_name("dfa_rows.c")


def _load(lib: Path) -> ModuleType:
    loader = importlib.machinery.ExtensionFileLoader("dfa_rows", str(lib))
    spec = importlib.util.spec_from_file_location("dfa_rows", lib, loader=loader)
    if spec is None:
        raise ImportError(f"cannot load {lib}")
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


@functools.cache
def dfa_rows() -> ModuleType | None:
    """The C module (`closure`, `fill_row`), or None (the Python twin) with the reason logged
    or warned once."""
    # The include path names the Python version, which the build's hash covers; macOS links
    # an extension's Python symbols when it is loaded, not when it is built.
    flags = (f"-I{sysconfig.get_paths()['include']}",)
    if sys.platform == "darwin":
        flags += ("-undefined", "dynamic_lookup")
    return load_native(
        "lazy DFA rows", "automaton rows use the slower Python code", SOURCE, _load, flags
    )


def describe() -> str:
    """Which code computes the lazy DFA's rows, for the startup log."""
    return "native rows" if dfa_rows() is not None else "Python rows"
