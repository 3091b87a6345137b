"""`global_config`: SGLang's process-wide frontend settings, with the same attribute names."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class GlobalConfig:
    """Mutable frontend settings; `default_backend` is what `set_default_backend` sets."""

    verbosity: int = 0
    default_backend: Any = None
    skip_special_tokens_in_output: bool = True
    spaces_between_special_tokens_in_out: bool = True
    enable_precache_with_tracing: bool = True
    enable_parallel_encoding: bool = True


global_config = GlobalConfig()
