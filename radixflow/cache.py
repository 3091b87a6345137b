"""Where radixflow keeps what it builds once per machine (converted GGUF models, compiled
kernels): `$RADIXFLOW_CACHE_DIR`, else `~/.cache/radixflow`."""

from __future__ import annotations

import os
import uuid
from pathlib import Path


def cache_dir(name: str) -> Path:
    """The folder `name` under the cache root (read from the environment on every call)."""
    base = os.environ.get("RADIXFLOW_CACHE_DIR")
    return (Path(base) if base else Path.home() / ".cache" / "radixflow") / name


def temporary_beside(target: Path) -> Path:
    """A name in `target`'s folder, unique to this process and call, for building `target`
    before renaming it into place (a reader never sees a half-written file or folder)."""
    return target.with_name(f".{target.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}")
