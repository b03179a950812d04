"""radixrt: a structured-generation runtime for LLMs.

Heavy names (Engine, which loads torch) are imported lazily (PEP 562), so that
`import radixrt` and `import radixrt.lang` stay light.
"""

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"
# The DSL's names (radixrt.lang.__all__; a test keeps the two lists equal), loaded on first use.
LANG_NAMES = [
    "Backend", "BatchResult", "EngineBackend", "Function", "ProgramIR", "ProgramState",
    "ProgramStateGroup", "Runtime", "RuntimeEndpoint", "assistant", "assistant_begin",
    "assistant_end", "flush_cache", "function", "gen", "gen_int", "gen_string",
    "get_default_backend", "get_server_info", "greedy_token_selection", "role", "select",
    "set_default_backend", "system", "system_begin", "system_end", "token_length_normalized",
    "unconditional_likelihood_normalized", "user", "user_begin", "user_end",
]
__all__ = ["Engine", "ServerArgs", "SamplingParams", *LANG_NAMES]

if TYPE_CHECKING:
    from radixrt.engine import Engine
    from radixrt.sampling_params import SamplingParams
    from radixrt.server_args import ServerArgs

_LAZY = {
    "Engine": "radixrt.engine",
    "ServerArgs": "radixrt.server_args",
    "SamplingParams": "radixrt.sampling_params",
    **{name: "radixrt.lang" for name in LANG_NAMES},
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'radixrt' has no attribute {name!r}")
