"""Every exception class of radixrt, in one place: those users see (ParamError, the HTTP
errors), those that end one request or the whole engine, and the process and rank failures.
Torch-free and import-free (the bottom layer: every part may raise or catch these)."""

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


class GrammarBusy(Exception):
    """Every compile worker stayed busy for the whole timeout: retry later (an HTTP 503)."""


class SchedulerDied(RuntimeError):
    """The scheduler side is gone (a child process died, or the engine was shut down): every
    request waiting on it fails with this, and so does every later call (HTTP 503)."""


class ServerShuttingDown(SchedulerDied):
    """The server is stopping (SIGTERM): new requests are refused and the requests still
    running at the end of the grace period end with this (HTTP 503)."""


class ServerOverloaded(RuntimeError):
    """More requests are waiting than max_queued_requests allows (HTTP 503)."""


class RequestFailed(Exception):
    """This request cannot go on (its constraint admits no token, a stop regex runs away...):
    it ends alone, with finish reason abort and this message; the others go on."""


class LockstepError(RuntimeError):
    """A rank's scheduler state no longer matches rank 0's."""


class RankDied(RuntimeError):
    """A collective did not complete within the group's timeout: a rank is gone or stuck."""


class APIError(Exception):
    """Raised by endpoint code for a bad request; rendered by `error_response`. `code`:
    OpenAI's error code, when not the one of `status` (STATUS_CODES)."""

    def __init__(
        self,
        message: str,
        param: str | None = None,
        status: int = 400,
        err_type: str = "invalid_request_error",
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.status = status
        self.err_type = err_type
        self.code = code


class BodyTooLarge(APIError):
    """The request body is over --max-request-bytes (HTTP 413)."""

    def __init__(self, limit: int) -> None:
        super().__init__(
            f"the request body is larger than the server's limit of {limit} "
            "bytes (--max-request-bytes)",
            None,
            413,
        )


class ClientDisconnected(Exception):
    """The client closed the connection before its answer was ready."""


class ModelNotFound(Exception):
    """A request's `model` is not the served model."""

    def __init__(self, model: str | None) -> None:
        super().__init__(model)
        self.model = model


class SchedulerStartError(RuntimeError):
    """The scheduler process failed before it was ready (its error, re-raised in the parent)."""
