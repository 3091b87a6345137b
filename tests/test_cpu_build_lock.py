"""A build of the CPU kernels killed half-way must not make every later engine start hang."""

from __future__ import annotations

import subprocess
import sys

import pytest

from radixflow.kernels.cpu_build import build_folder, build_root, current_choice

pytestmark = pytest.mark.skipif(
    current_choice().isa is None, reason="this CPU runs none of the kernels' ISAs"
)

_BUILD = "from radixflow.kernels import cpu_build; assert cpu_build.build().isa"


def _build_in_a_new_process(timeout: float) -> None:
    subprocess.run([sys.executable, "-c", _BUILD], timeout=timeout, check=True)


def test_a_lock_file_left_by_a_killed_build_is_cleared():
    _build_in_a_new_process(timeout=900)  # built once (the other kernel tests reuse it)
    folder = build_folder(build_root())
    # What torch's builder leaves when its process dies while holding its build lock: before
    # the fix every later process waited on it forever.
    (folder / "lock").touch()
    _build_in_a_new_process(timeout=300)
    assert not (folder / "lock").exists()
