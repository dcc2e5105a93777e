"""The exception tree of spinf-serve: every exception a caller of the package can meet, in one drawing.

::

    SpinfError                          root of everything this package raises on purpose
    ├── ApiError                        a request problem with the spec's HTTP status, code and param path
    │   └── RemoteApiError              a server's 4xx answer to the bulk runner, with its request id (bulk.errors)
    ├── ModelError                      a model that cannot be resolved, found or loaded
    │   ├── TinySnapshotMissing         the tiny model's snapshot is not generated yet (catalog.checkpoint)
    │   └── ScaleTableMismatch          an fp8s scale table made for another checkpoint (engine.scales)
    ├── ConfigError                     a bad setting (the command line prints it as one line, exit status 2)
    ├── BulkError                       a bulk run that cannot go on (bulk.errors)
    │   └── BulkInputError              a bad line or file of a bulk run's inputs
    ├── BatchFailed                     the scorer refused a bulk batch; carries the batch and the envelope
    ├── SourceError                     a pack source that cannot be read (packs.sources)
    │   └── GitHubError                 ... from GitHub (packs.github): NotFound, RateLimited, HttpError,
    │                                   Unreachable, BadTarball
    ├── ArchiveError                    a pack tarball that cannot be unpacked safely (packs.tarball)
    └── PackEvaluationError             a pack that cannot be evaluated on these answers (packs.pipeline)

    StartInterrupted (BaseException)    a signal during serve's start, before the actors listen (server.start_signals)
    IllegalTransition (RuntimeError)    a lifecycle step the state machine forbids: a bug (server.lifecycle)

Signals that never leave their module, each caught beside where it is raised: settings.kinds.Refused,
packs.contexts.ParameterError, packs.versions.UnorderableVersions, bulk.inputs._BadLine, server.gate._BodyGone,
server.http11.Refusal.

``ApiError`` is what the web layer turns into the error envelope; the library API (``Engine.score``) raises it
as is. Bugs are not wrapped: they crash the caller (the server answers 500 ``engine_error``).
"""

from __future__ import annotations

_TYPE_BY_STATUS = {
    400: "invalid_request",
    401: "authentication_error",
    404: "not_found",
    413: "invalid_request",
    429: "rate_limited",
    503: "unavailable",
}


class SpinfError(Exception):
    """Root of the exceptions spinf-serve raises on purpose."""


class ApiError(SpinfError):
    """A request the server refuses, with the HTTP status, the spec's code and the param path (or None)."""

    def __init__(self, status: int, code: str, param: str | None, message: str, *, retry_after: int | None = None):
        super().__init__(message)
        self.status = status
        self.code = code
        self.param = param
        self.message = message
        self.retry_after = retry_after

    @property
    def type(self) -> str:
        if self.status in _TYPE_BY_STATUS:
            return _TYPE_BY_STATUS[self.status]
        return "api_error" if self.status >= 500 else "invalid_request"

    def envelope(self, request_id: str, *, trusted: bool = False) -> dict:
        """The JSON error body of spec §2.5 (``rejected`` only for trusted callers on 400 and 413)."""
        body: dict = {
            "error": {"type": self.type, "code": self.code, "message": self.message, "param": self.param},
            "request_id": request_id,
        }
        if trusted and self.status in (400, 413):
            body["rejected"] = {"code": self.code, "message": self.message, "param": self.param}
        return body

    def __repr__(self) -> str:
        return f"ApiError({self.status}, {self.code!r}, {self.param!r}, {self.message!r})"


def bad_request(code: str, param: str | None, message: str) -> ApiError:
    """A 400 ``ApiError``; the common case, kept short at call sites."""
    return ApiError(400, code, param, message)


class ModelError(SpinfError):
    """A model that cannot be resolved, found or loaded."""


class ConfigError(SpinfError):
    """A bad setting; the message names the setting, where it came from and what is allowed."""
