"""Where programs run: a running server (RuntimeEndpoint), a server started here (Runtime), or
an Engine in this process (EngineBackend)."""

from radixrt.lang.backends.base import Backend
from radixrt.lang.backends.engine_backend import EngineBackend
from radixrt.lang.backends.runtime import Runtime
from radixrt.lang.backends.runtime_endpoint import RuntimeEndpoint

__all__ = ["Backend", "EngineBackend", "Runtime", "RuntimeEndpoint"]
