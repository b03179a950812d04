"""`radixrt.global_config`: the frontend's process-wide settings, SGLang's fields.

`default_backend` is the backend `run` uses when given none; `set_default_backend(x)` and
`global_config.default_backend = x` are the same thing.
"""

from __future__ import annotations

from typing import Any


class GlobalConfig:
    """Fields (an unknown name is an error, not a silent no-op):
    - default_backend: a Backend (RuntimeEndpoint, Runtime, EngineBackend) or an Engine; None.
    - verbosity: 0 quiet; 2 prints each program's final text when its run ends.
    - skip_special_tokens_in_output, spaces_between_special_tokens_in_out: sent with every gen
      as the sampling parameters skip_special_tokens and spaces_between_special_tokens.
    - enable_precache_with_tracing: run_batch prefills the text every program starts with once
      (found by tracing) before running them.
    - enable_parallel_encoding: accepted for SGLang programs; radixrt's join("concate_and_
      append") always appends the branches' text (no KV concatenation), so it has no effect.
    """

    FIELDS = (
        "default_backend",
        "verbosity",
        "skip_special_tokens_in_output",
        "spaces_between_special_tokens_in_out",
        "enable_precache_with_tracing",
        "enable_parallel_encoding",
    )

    def __init__(self) -> None:
        self._default_backend = None
        self.verbosity = 0
        self.skip_special_tokens_in_output = True
        self.spaces_between_special_tokens_in_out = True
        self.enable_precache_with_tracing = True
        self.enable_parallel_encoding = True

    @property
    def default_backend(self) -> Any:
        return self._default_backend

    @default_backend.setter
    def default_backend(self, backend: Any) -> None:
        from radixrt.lang.default_backend import resolve_backend

        self._default_backend = None if backend is None else resolve_backend(backend)

    def __setattr__(self, name: str, value: Any) -> None:
        if name != "_default_backend" and name not in self.FIELDS:
            raise AttributeError(
                f"global_config has no field {name!r}; its fields: {', '.join(self.FIELDS)}"
            )
        super().__setattr__(name, value)

    def __repr__(self) -> str:
        return "GlobalConfig(" + ", ".join(f"{f}={getattr(self, f)!r}" for f in self.FIELDS) + ")"


global_config = GlobalConfig()
