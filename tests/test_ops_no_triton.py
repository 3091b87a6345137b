"""Without triton installed (triton exists only on Linux) radixflow imports, builds a CPU engine
and generates: nothing imports triton unless a Triton kernel is chosen."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from tiny_models import make_tiny_model_dir

PROGRAM = textwrap.dedent(
    """
    import sys

    class NoTriton:
        def find_spec(self, name, path=None, target=None):
            if name == "triton" or name.startswith("triton."):
                raise ImportError(f"{name} is not installed (blocked by the test)")
            return None

    sys.meta_path.insert(0, NoTriton())
    import radixflow as rf

    engine = rf.Engine(sys.argv[1], device="cpu", dtype="float32", max_total_tokens=256)
    try:
        out = engine.generate("The quick brown", {"max_new_tokens": 4, "temperature": 0})
    finally:
        engine.shutdown()
    assert len(out["output_ids"]) == 4, out
    loaded = sorted(m for m in sys.modules if m == "triton" or m.startswith("triton."))
    assert not loaded, loaded
    print("ok", out["output_ids"])
    """
)


def test_cpu_engine_runs_without_triton(tmp_path: Path) -> None:
    model = make_tiny_model_dir(tmp_path / "llama")
    done = subprocess.run(
        [sys.executable, "-c", PROGRAM, str(model)],
        cwd=tmp_path,  # not the checkout: its kernels/ folder would shadow Hugging Face's `kernels`
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.startswith("ok ")
