"""The backend programs run on when `run` is given none."""

from __future__ import annotations

import weakref
from typing import Any

from radixrt.lang.backends.base import Backend

_default: Backend | None = None
_engine_wrappers: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def set_default_backend(backend: Any) -> None:
    """A Backend (RuntimeEndpoint, Runtime, EngineBackend) or a radixrt.Engine; None unsets."""
    global _default
    _default = None if backend is None else resolve_backend(backend)


def get_default_backend() -> Backend | None:
    return _default


def resolve_backend(backend: Any = None) -> Backend:
    if backend is None:
        if _default is None:
            raise RuntimeError("no backend: call radixrt.set_default_backend(...) (e.g. with "
                               "RuntimeEndpoint(url) or Runtime()) or pass backend= to run")
        return _default
    if isinstance(backend, Backend):
        return backend
    if type(backend).__name__ == "Engine" and hasattr(backend, "generate"):
        from radixrt.lang.backends.engine_backend import EngineBackend

        if backend not in _engine_wrappers:
            _engine_wrappers[backend] = EngineBackend(engine=backend)
        return _engine_wrappers[backend]
    raise TypeError(f"backend must be a RuntimeEndpoint, Runtime, EngineBackend or Engine, got "
                    f"{type(backend).__name__}")


def flush_cache(backend: Any = None) -> bool:
    """Empty the backend's radix cache (refused, False, while requests run)."""
    return resolve_backend(backend).flush_cache()


def get_server_info(backend: Any = None) -> dict[str, Any]:
    return resolve_backend(backend).get_server_info()
