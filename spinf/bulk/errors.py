"""The errors of bulk scoring: bad files or arguments, a run that cannot go on, and a batch the scorer refused.

::

    SpinfError
    ├── BulkError                   the run cannot go on (retries spent, a scorer answering nonsense)
    │   └── BulkInputError          a bad request file, inputs file, output file or argument (fix it, run again)
    ├── BatchFailed                 the scorer refused a batch with an ApiError; carries the batch and the envelope
    └── ApiError
        └── RemoteApiError          a server's 4xx answer, with the request id the server gave it
"""

from __future__ import annotations

import re

from spinf.errors import ApiError, SpinfError

_INPUT_PARAM = re.compile(r"^inputs\.(\d+)(.*)$")


def request_id_of(error: ApiError) -> str:
    """The server's request id of a remote refusal; a fresh one for the engine's (which has none)."""
    from spinf.protocol.ids import new_request_id  # spinf.protocol pulls in the settings; only errors need it

    return getattr(error, "request_id", None) or new_request_id()


class BulkError(SpinfError):
    """The run cannot go on; the message says why and, where one is involved, names the batch."""


class BulkInputError(BulkError):
    """A bad request file, inputs file, output file or argument; the message names the file and line."""


class RemoteApiError(ApiError):
    """A server's refusal (a 4xx other than 429), with the ``request_id`` of its error envelope."""

    def __init__(self, status: int, code: str, param: str | None, message: str, *, request_id: str | None):
        super().__init__(status, code, param, message)
        self.request_id = request_id


def batch_param(param: str | None, batch: list) -> tuple[str | None, object | None]:
    """A batch-relative param (``inputs.<k>…``) counted over the whole inputs file, and the input it names."""
    match = _INPUT_PARAM.match(param or "")
    if match is None or int(match[1]) >= len(batch):
        return param, None
    item = batch[int(match[1])]
    return f"inputs.{item.index}{match[2]}", item


class BatchFailed(SpinfError):
    """The scorer refused a batch. ``param`` counts inputs over the whole inputs file, as if it were one call."""

    def __init__(self, error: ApiError, batch: list):
        self.error = error
        self.first = batch[0]
        self.param, self.culprit = batch_param(error.param, batch)
        self.request_id = request_id_of(error)
        super().__init__(f"{self.where}: {error.status} {error.code}: {error.message}")

    @property
    def where(self) -> str:
        if self.culprit is not None:
            return f"input {self.culprit.id!r} (line {self.culprit.line})"
        return f"the batch starting at input {self.first.id!r} (line {self.first.line})"

    def envelope(self) -> dict:
        """The error envelope of api spec §2.5 without ``rejected``, its param counted over the inputs file."""
        body = self.error.envelope(self.request_id)
        body["error"]["param"] = self.param
        return body
