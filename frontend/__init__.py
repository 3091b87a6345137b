"""The DSL: SGLang's frontend surface, so `import radixflow as sgl` runs SGLang programs.

@rf.function
def qa(s, question):
    s += rf.user(question)
    s += rf.assistant(rf.gen("answer", max_tokens=64))

rf.set_default_backend(rf.Runtime())
print(qa.run(question="What is 2 + 2?")["answer"])
"""

from radixflow.frontend.api import (
    assistant,
    assistant_begin,
    assistant_end,
    flush_cache,
    gen,
    gen_int,
    gen_string,
    get_server_info,
    image,
    select,
    separate_reasoning,
    system,
    system_begin,
    system_end,
    user,
    user_begin,
    user_end,
    video,
)
from radixflow.frontend.backend import Backend, RequestError
from radixflow.frontend.chat_template import ChatTemplate
from radixflow.frontend.choices import (
    ChoicesDecision,
    ChoicesSamplingMethod,
    greedy_token_selection,
    token_length_normalized,
    unconditional_likelihood_normalized,
)
from radixflow.frontend.endpoint import RuntimeEndpoint
from radixflow.frontend.global_config import GlobalConfig, global_config
from radixflow.frontend.openai_backend import OpenAI, TokenUsage
from radixflow.frontend.program import (
    SglFunction,
    function,
    get_default_backend,
    set_default_backend,
)
from radixflow.frontend.program_error import ProgramError
from radixflow.frontend.runtime_backend import Runtime
from radixflow.frontend.state import ProgramState, ProgramStateGroup
from radixflow.frontend.tracer import ProgramTrace

__all__ = [
    "Backend",
    "ChatTemplate",
    "ChoicesDecision",
    "ChoicesSamplingMethod",
    "GlobalConfig",
    "OpenAI",
    "ProgramError",
    "ProgramState",
    "ProgramStateGroup",
    "ProgramTrace",
    "RequestError",
    "Runtime",
    "RuntimeEndpoint",
    "SglFunction",
    "TokenUsage",
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
    "global_config",
    "greedy_token_selection",
    "image",
    "select",
    "separate_reasoning",
    "set_default_backend",
    "system",
    "system_begin",
    "system_end",
    "token_length_normalized",
    "unconditional_likelihood_normalized",
    "user",
    "user_begin",
    "user_end",
    "video",
]
