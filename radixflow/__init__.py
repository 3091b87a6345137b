"""radixflow: structured generation programs on a fast LLM runtime.

    import radixflow as rf
    engine = rf.Engine()                       # the default model (SmolLM2-135M-Instruct)
    engine.generate("The capital of France is", {"max_new_tokens": 8})

The DSL keeps SGLang's names, so `import radixflow as sgl` runs SGLang frontend programs.
"""

from radixflow import frontend
from radixflow.frontend import *  # noqa: F403  (the DSL's public names, listed in its __all__)
from radixflow.runtime.config import EngineConfig
from radixflow.runtime.engine import Engine
from radixflow.runtime.sampling_params import SamplingParams

__all__ = ["Engine", "EngineConfig", "SamplingParams", *frontend.__all__]
__version__ = "0.1.0"
