"""radixflow: structured generation programs on a fast LLM runtime.

    import radixflow as rf
    engine = rf.Engine()                       # the default model (SmolLM2-135M-Instruct)
    engine.generate("The capital of France is", {"max_new_tokens": 8})

The DSL keeps SGLang's names, so `import radixflow as sgl` runs SGLang frontend programs.
`import radixflow` loads only the DSL; the runtime (torch, transformers) loads on first use of
`rf.Engine`, `rf.EngineConfig` or `rf.SamplingParams`, or when an `rf.Runtime` is built.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from radixflow import frontend
from radixflow._version import __version__ as __version__
from radixflow.frontend import *  # noqa: F403  (the DSL's public names, listed in its __all__)

if TYPE_CHECKING:
    from radixflow.runtime.config import EngineConfig
    from radixflow.runtime.engine import Engine
    from radixflow.runtime.sampling_params import SamplingParams

# public name -> the module that defines it, imported on first access
_RUNTIME_NAMES = {
    "Engine": "radixflow.runtime.engine",
    "EngineConfig": "radixflow.runtime.config",
    "SamplingParams": "radixflow.runtime.sampling_params",
}

__all__ = ["Engine", "EngineConfig", "SamplingParams", *frontend.__all__]


def __getattr__(name: str) -> Any:
    if name not in _RUNTIME_NAMES:
        raise AttributeError(f"module 'radixflow' has no attribute {name!r}")
    value = getattr(importlib.import_module(_RUNTIME_NAMES[name]), name)
    globals()[name] = value  # later lookups skip this hook
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_RUNTIME_NAMES))
