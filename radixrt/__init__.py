"""radixrt: a structured-generation runtime for LLMs.

Heavy names (Engine, which loads torch) are imported lazily (PEP 562), so that
`import radixrt` and `import radixrt.lang` stay light.
"""

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"
__all__ = ["Engine", "ServerArgs", "SamplingParams"]

if TYPE_CHECKING:
    from radixrt.engine import Engine
    from radixrt.sampling_params import SamplingParams
    from radixrt.server_args import ServerArgs

_LAZY = {
    "Engine": "radixrt.engine",
    "ServerArgs": "radixrt.server_args",
    "SamplingParams": "radixrt.sampling_params",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'radixrt' has no attribute {name!r}")
