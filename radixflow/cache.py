"""Where radixflow keeps what it builds once per machine (converted GGUF models, compiled
kernels): `$RADIXFLOW_CACHE_DIR`, else `~/.cache/radixflow`."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir(name: str) -> Path:
    """The folder `name` under the cache root (read from the environment on every call)."""
    base = os.environ.get("RADIXFLOW_CACHE_DIR")
    return (Path(base) if base else Path.home() / ".cache" / "radixflow") / name
