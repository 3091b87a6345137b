"""radixflow: structured generation programs on a fast LLM runtime.

import radixflow as rf
engine = rf.Engine()                       # the default model (SmolLM2-135M-Instruct)
engine.generate("The capital of France is", {"max_new_tokens": 8})
"""

from radixflow.runtime.config import EngineConfig
from radixflow.runtime.engine import Engine
from radixflow.runtime.sampling_params import SamplingParams

__all__ = ["Engine", "EngineConfig", "SamplingParams"]
__version__ = "0.1.0"

# The DSL (frontend): SGLang's names, so `import radixflow as sgl` runs SGLang programs.
from radixflow.frontend import (  # noqa: E402
    Backend,
    ChatTemplate,
    ChoicesDecision,
    ChoicesSamplingMethod,
    OpenAI,
    ProgramError,
    ProgramState,
    ProgramStateGroup,
    ProgramTrace,
    RequestError,
    Runtime,
    RuntimeEndpoint,
    SglFunction,
    assistant,
    assistant_begin,
    assistant_end,
    flush_cache,
    function,
    gen,
    gen_int,
    gen_string,
    get_default_backend,
    get_server_info,
    greedy_token_selection,
    select,
    set_default_backend,
    system,
    system_begin,
    system_end,
    token_length_normalized,
    unconditional_likelihood_normalized,
    user,
    user_begin,
    user_end,
)

__all__ += [
    "Backend",
    "ChatTemplate",
    "ChoicesDecision",
    "ChoicesSamplingMethod",
    "OpenAI",
    "ProgramError",
    "ProgramState",
    "ProgramStateGroup",
    "ProgramTrace",
    "RequestError",
    "Runtime",
    "RuntimeEndpoint",
    "SglFunction",
    "assistant",
    "assistant_begin",
    "assistant_end",
    "flush_cache",
    "function",
    "gen",
    "gen_int",
    "gen_string",
    "get_default_backend",
    "get_server_info",
    "greedy_token_selection",
    "select",
    "set_default_backend",
    "system",
    "system_begin",
    "system_end",
    "token_length_normalized",
    "unconditional_likelihood_normalized",
    "user",
    "user_begin",
    "user_end",
]
