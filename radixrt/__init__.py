"""radixrt: a structured-generation runtime for LLMs.

Heavy names (Engine, which loads torch) are imported lazily (PEP 562), so that
`import radixrt` and `import radixrt.lang` stay light. The frontend language's names
(radixrt.lang.__all__: gen, select, function, RuntimeEndpoint, global_config, ...) are
re-exported here, loaded on first use, so `import radixrt as sgl` runs SGLang programs.
"""

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"
# + radixrt.lang.__all__
__all__ = ["Engine", "ServerArgs", "SamplingParams", "BeamSearchParams", "__version__"]

if TYPE_CHECKING:
    from radixrt.frontend.beam_api import BeamSearchParams
    from radixrt.frontend.engine import Engine
    from radixrt.lang import *  # noqa: F403
    from radixrt.protocol.sampling_params import SamplingParams
    from radixrt.server_args import ServerArgs

_LAZY = {
    "Engine": "radixrt.frontend.engine",
    "BeamSearchParams": "radixrt.frontend.beam_api",
    "ServerArgs": "radixrt.server_args",
    "SamplingParams": "radixrt.protocol.sampling_params",
}


_SGLANG_API_BACKENDS = ("OpenAI", "Anthropic", "LiteLLM", "VertexAI", "Crusoe")


def _lang_names() -> list[str]:
    return importlib.import_module("radixrt.lang").__all__


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    if not name.startswith("_") and name in _lang_names():
        return getattr(importlib.import_module("radixrt.lang"), name)
    if name in _SGLANG_API_BACKENDS:
        raise AttributeError(
            f"module 'radixrt' has no attribute {name!r}: radixrt runs "
            "programs on its own runtime (RuntimeEndpoint, Runtime, "
            "EngineBackend), not on API backends such as SGLang's "
            f"{', '.join(_SGLANG_API_BACKENDS)}"
        )
    raise AttributeError(f"module 'radixrt' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_LAZY, *_lang_names()])
