"""Errors that every part may raise or catch, torch-free (the HTTP process imports this)."""

from __future__ import annotations

# OpenAI's `code` for a request that does not fit the model's context (litellm, for one,
# turns it into ContextWindowExceededError and falls back to a larger model).
CONTEXT_LENGTH_EXCEEDED = "context_length_exceeded"


class ParamError(ValueError):
    """A bad request field: `param` is the field's name as the request spelled it (SGLang's
    names: "max_new_tokens", "input_ids", "regex"...), or None when no one field is at fault.
    The servers answer it with HTTP 400 and `param`; the OpenAI layer renames it to the
    OpenAI field it came from. `code`: OpenAI's error code when the error has a specific one
    (CONTEXT_LENGTH_EXCEEDED), else None. A ValueError, so `except ValueError` still
    catches it."""

    def __init__(self, param: str | None, message: str, code: str | None = None) -> None:
        super().__init__(message)
        self.param = param
        self.message = message
        self.code = code
