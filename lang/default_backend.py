"""The backend programs run on when `run` is given none (global_config.default_backend)."""

from __future__ import annotations

import weakref
from typing import Any

from radixrt.lang.backends.base import Backend
from radixrt.lang.global_config import global_config

_engine_wrappers: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def set_default_backend(backend: Any) -> None:
    """A Backend (RuntimeEndpoint, Runtime, EngineBackend) or a radixrt.Engine; None unsets.
    The same as `global_config.default_backend = backend`."""
    global_config.default_backend = backend


def get_default_backend() -> Backend | None:
    return global_config.default_backend


def resolve_backend(backend: Any = None) -> Backend:
    if backend is None:
        if global_config.default_backend is None:
            raise RuntimeError(
                "no backend: call radixrt.set_default_backend(...) (e.g. with "
                "RuntimeEndpoint(url) or Runtime()) or pass backend= to run"
            )
        return global_config.default_backend
    if isinstance(backend, Backend):
        return backend
    if type(backend).__name__ == "Engine" and hasattr(backend, "generate"):
        from radixrt.lang.backends.engine_backend import EngineBackend

        if backend not in _engine_wrappers:
            _engine_wrappers[backend] = EngineBackend(engine=backend)
        return _engine_wrappers[backend]
    raise TypeError(
        f"backend must be a RuntimeEndpoint, Runtime, EngineBackend or Engine, got "
        f"{type(backend).__name__}"
    )


def flush_cache(backend: Any = None) -> bool:
    """Empty the backend's radix cache (refused, False, while requests run). As SGLang's:
    False when there is no backend at all."""
    if backend is None and global_config.default_backend is None:
        return False
    return resolve_backend(backend).flush_cache()


def get_server_info(backend: Any = None) -> dict[str, Any] | None:
    """The server's /server_info; as SGLang's, None when there is no backend at all."""
    if backend is None and global_config.default_backend is None:
        return None
    return resolve_backend(backend).get_server_info()
