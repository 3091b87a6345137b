"""Load SGLang's own test programs (`sglang/test/test_programs.py` from the installed wheel).

Two ways to run them:
- `radixflow` as `sglang`: the module is imported with `sys.modules["sglang"]` set to radixflow,
  so `sgl.function`, `sgl.gen`, ... are ours (the in-process `rf.Runtime` backend).
- SGLang's real frontend (`sglang.lang`) and its real `RuntimeEndpoint` against our server.

`import sglang` runs sglang/__init__.py, which pulls in the GPU server stack, so the package
is never imported as a whole: a bare package module points at the wheel's folder, and the
few light modules the frontend needs but this venv lacks (msgspec, pybase64, IPython) are
stand-ins that only satisfy its imports. Everything is undone when the fixture ends.
"""

from __future__ import annotations

import importlib.util
import sys
import types
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

_STUBBED_PREFIXES = ("sglang", "msgspec", "pybase64", "IPython", "sglang_test_programs")


def sglang_dir() -> Path:
    """The installed sglang wheel's folder; skips the test when it is absent."""
    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("the sglang wheel is not installed (pip install --no-deps sglang)")
    root = Path(next(iter(spec.submodule_search_locations)))
    if not (root / "test" / "test_programs.py").is_file():
        pytest.skip(f"{root} has no test/test_programs.py")
    return root


def _module(name: str, path: Path | None = None, **attrs: Any) -> types.ModuleType:
    mod = types.ModuleType(name)
    if path is not None:
        mod.__path__ = [str(path)]
    mod.__dict__.update(attrs)
    return mod


def _get_tokenizer(name: str, **kwargs: Any):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(name, **kwargs)


@contextmanager
def _isolated_modules() -> Iterator[dict[str, types.ModuleType]]:
    """sys.modules entries added or replaced inside are restored on exit."""
    saved = {k: v for k, v in sys.modules.items() if k.startswith(_STUBBED_PREFIXES)}
    try:
        yield sys.modules  # type: ignore[misc]
    finally:
        for k in [k for k in sys.modules if k.startswith(_STUBBED_PREFIXES)]:
            del sys.modules[k]
        sys.modules.update(saved)


def _srt_stubs(root: Path) -> dict[str, types.ModuleType]:
    """What test_programs.py imports from sglang.srt: is_hip and get_tokenizer."""
    utils = _module("sglang.srt.utils", root / "srt" / "utils", is_hip=lambda: False)
    return {
        "sglang.srt": _module("sglang.srt", root / "srt"),
        "sglang.srt.utils": utils,
        "sglang.srt.utils.hf_transformers_utils": _module(
            "sglang.srt.utils.hf_transformers_utils", get_tokenizer=_get_tokenizer
        ),
    }


def _load_programs(root: Path) -> types.ModuleType:
    path = root / "test" / "test_programs.py"
    spec = importlib.util.spec_from_file_location("sglang_test_programs", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@contextmanager
def programs_on_radixflow() -> Iterator[types.ModuleType]:
    """test_programs with `import sglang as sgl` bound to radixflow."""
    import radixflow
    import radixflow.frontend.ir

    root = sglang_dir()
    with _isolated_modules() as modules:
        modules["sglang"] = radixflow
        modules["sglang.lang"] = _module("sglang.lang", root / "lang")
        modules["sglang.lang.ir"] = radixflow.frontend.ir
        modules.update(_srt_stubs(root))
        yield _load_programs(root)


@contextmanager
def programs_on_sglang() -> Iterator[tuple[types.ModuleType, types.ModuleType]]:
    """(test_programs, sglang) with SGLang's real frontend package (sglang.lang)."""
    root = sglang_dir()
    with _isolated_modules() as modules:
        sgl = _module("sglang", root)
        modules["sglang"] = sgl
        modules.update(_srt_stubs(root))
        # Imported by sglang.utils / runtime_endpoint but unused by the frontend paths here.
        msgspec = _module("msgspec", structs=_module("msgspec.structs"))
        modules["msgspec"], modules["msgspec.structs"] = msgspec, msgspec.structs
        modules["pybase64"] = _module("pybase64")
        modules["IPython"] = _module("IPython", display=None)
        modules["IPython.display"] = _module("IPython.display", HTML=None, display=None)
        from sglang.lang import api  # noqa: I001  (after the stand-ins)
        from sglang.lang import choices
        from sglang.lang.backend.runtime_endpoint import RuntimeEndpoint
        from sglang.lang.global_config import global_config

        for name in dir(api):
            if not name.startswith("_"):
                setattr(sgl, name, getattr(api, name))
        for name in ("greedy_token_selection", "token_length_normalized"):
            setattr(sgl, name, getattr(choices, name))
        sgl.unconditional_likelihood_normalized = choices.unconditional_likelihood_normalized
        sgl.RuntimeEndpoint = RuntimeEndpoint
        sgl.global_config = global_config
        yield _load_programs(root), sgl
