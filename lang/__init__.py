"""radixrt.lang: write multi-call LLM programs the SGLang way; they run on radixrt.

Light on purpose: importing it loads no torch, triton or transformers (a client machine needs
only zmq, msgspec, httpx and jinja2). The names are re-exported by `radixrt` itself.
"""

from radixrt.lang.backends import Backend, EngineBackend, Runtime, RuntimeEndpoint
from radixrt.lang.choices import (
    greedy_token_selection,
    token_length_normalized,
    unconditional_likelihood_normalized,
)
from radixrt.lang.default_backend import (
    flush_cache,
    get_default_backend,
    get_server_info,
    set_default_backend,
)
from radixrt.lang.function import BatchResult, Function, function
from radixrt.lang.global_config import GlobalConfig, global_config
from radixrt.lang.ir import (
    assistant,
    assistant_begin,
    assistant_end,
    gen,
    gen_int,
    gen_string,
    image,
    role,
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
from radixrt.lang.state import ProgramState, ProgramStateGroup
from radixrt.lang.tracer import ProgramIR

__all__ = [
    "Backend",
    "BatchResult",
    "EngineBackend",
    "Function",
    "GlobalConfig",
    "ProgramIR",
    "ProgramState",
    "ProgramStateGroup",
    "Runtime",
    "RuntimeEndpoint",
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
    "role",
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
