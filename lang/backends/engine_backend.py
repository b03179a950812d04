"""A backend over a `radixrt.Engine` in this process: programs without a server."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from radixrt.lang.backends.base import Backend
from radixrt.lang.chat_template import ChatTemplate


class EngineBackend(Backend):
    """`EngineBackend(engine)` uses an Engine you own; `EngineBackend(**engine_args)` starts
    one (this imports torch) and shuts it down with `shutdown()`."""

    def __init__(self, engine: Any = None, **engine_args: Any) -> None:
        if engine is None:
            from radixrt.frontend.engine import Engine

            engine = Engine(**engine_args)
            self._owned = True
        elif engine_args:
            raise TypeError("EngineBackend: give an engine or engine arguments, not both")
        else:
            self._owned = False
        self.engine = engine
        tok = engine.tokenizer
        self._template = ChatTemplate.from_jinja(
            getattr(tok, "chat_template", None),
            getattr(tok, "bos_token", None),
            getattr(tok, "eos_token", None),
        )

    def _generate(self, text: Any = None, **request: Any) -> Any:
        return self.engine.generate(prompt=text, **request)

    def _generate_stream(self, text: Any = None, **request: Any) -> Iterator[dict[str, Any]]:
        return self.engine.generate(prompt=text, stream=True, **request)

    def get_chat_template(self) -> ChatTemplate:
        return self._template

    def flush_cache(self) -> bool:
        return self.engine.flush_cache()

    def get_server_info(self) -> dict[str, Any]:
        return self.engine.get_server_info()

    def model_path(self) -> str | None:
        return getattr(getattr(self.engine, "info", None), "model_path", None)

    def shutdown(self) -> None:
        if self._owned:
            self.engine.shutdown()
