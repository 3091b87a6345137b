"""`import radixflow` stays light, every public name resolves, and optional extras fail clearly."""

import importlib
import json
import subprocess
import sys
import textwrap

import pytest

import radixflow as rf


def run_python(code: str, cwd) -> str:
    """Run code in a fresh interpreter (outside the repository) and return its stdout."""
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_import_loads_no_heavy_module(tmp_path):
    out = run_python(
        """
        import json, sys
        import radixflow
        heavy = ("torch", "triton", "transformers")
        print(json.dumps([m for m in heavy if m in sys.modules]))
        """,
        tmp_path,
    )
    assert json.loads(out) == []


def test_runtime_names_load_on_first_use(tmp_path):
    out = run_python(
        """
        import json, sys
        import radixflow as rf
        before = "torch" in sys.modules
        from radixflow import SamplingParams
        from radixflow.runtime.sampling_params import SamplingParams as defined
        print(json.dumps([before, SamplingParams is defined, "SamplingParams" in vars(rf)]))
        """,
        tmp_path,
    )
    assert json.loads(out) == [False, True, True]


def test_every_public_name_resolves():
    assert len(rf.__all__) == len(set(rf.__all__))
    for name in rf.__all__:
        assert getattr(rf, name) is not None, name
    assert set(rf.__all__) <= set(dir(rf))
    engine_module = importlib.import_module("radixflow.runtime.engine")
    assert rf.Engine is engine_module.Engine
    from radixflow import EngineConfig

    assert EngineConfig is importlib.import_module("radixflow.runtime.config").EngineConfig


def test_unknown_attribute_raises():
    with pytest.raises(AttributeError, match="no_such_name"):
        rf.no_such_name  # noqa: B018


def test_openai_backend_without_the_package_says_how_to_install(tmp_path):
    out = run_python(
        """
        import sys
        from importlib.abc import MetaPathFinder

        class NoOpenAI(MetaPathFinder):
            def find_spec(self, name, path=None, target=None):
                if name == "openai" or name.startswith("openai."):
                    raise ImportError(f"No module named {name!r}")
                return None

        sys.meta_path.insert(0, NoOpenAI())
        import radixflow as rf
        try:
            rf.OpenAI("gpt-4o-mini")
        except ImportError as exc:
            print(exc)
        """,
        tmp_path,
    )
    assert 'pip install "radixflow[openai]"' in out
