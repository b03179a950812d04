"""Errors that every part may raise or catch, torch-free (the HTTP process imports this)."""

from __future__ import annotations


class ParamError(ValueError):
    """A bad request field: `param` is the field's name as the request spelled it (SGLang's
    names: "max_new_tokens", "input_ids", "regex"...), or None when no one field is at fault.
    The servers answer it with HTTP 400 and `param`; the OpenAI layer renames it to the
    OpenAI field it came from. A ValueError, so `except ValueError` still catches it."""

    def __init__(self, param: str | None, message: str) -> None:
        super().__init__(message)
        self.param = param
        self.message = message
