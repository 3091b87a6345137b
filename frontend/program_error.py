"""ProgramError and the program source lines ("sites") it points at."""

from __future__ import annotations

import linecache
import sys
import traceback
from collections.abc import Callable


class ProgramError(RuntimeError):
    """A program failed: its body raised, or a gen/select it ran failed.

    The message names the program line; `__cause__` is the original exception.
    """

    def __init__(self, message: str, site: str | None = None) -> None:
        super().__init__(message if site is None else f"{message}\n  at {site}")
        self.site = site


def caller_site() -> str | None:
    """'File "f.py", line 12, in prog: s += gen(...)' for the nearest frame outside radixflow."""
    frame = sys._getframe(1)
    while frame is not None and frame.f_globals.get("__name__", "").startswith("radixflow."):
        frame = frame.f_back
    if frame is None:
        return None
    return _describe(frame.f_code.co_filename, frame.f_lineno, frame.f_code.co_name)


def _describe(filename: str, lineno: int, name: str) -> str:
    code = linecache.getline(filename, lineno).strip()
    return f'File "{filename}", line {lineno}, in {name}' + (f": {code}" if code else "")


def body_site(exc: BaseException, func: Callable) -> str | None:
    """The deepest traceback line inside the program's own source file."""
    filename = getattr(getattr(func, "__code__", None), "co_filename", None)
    site = None
    for fs in traceback.extract_tb(exc.__traceback__):
        if fs.filename == filename:
            site = _describe(fs.filename, fs.lineno or 0, fs.name)
    return site
