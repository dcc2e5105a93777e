"""Scoring through running servers: one callable per URL that POSTs a body to ``/v1/score`` and returns the response.

Retries follow spinf-client (api spec §12.2): 429, every status of 500 and up, timeouts and connection errors are
tried again, waiting ``min(120, Retry-After)`` when the header is a plain number, else ``min(60, 2**attempt)``
(attempt from 0), plus up to a second of jitter so that parallel workers do not retry in step. After ``tries``
attempts the call raises `BulkError`. Any other non-200 answer raises `RemoteApiError` at once with the server's
code, message and param (redirects are not followed: a POST must not silently turn into a GET elsewhere).

Stdlib only (``urllib.request``): the callables are safe to call from several threads at once, each call opening
its own connection. The key, when given, goes out as ``Authorization: Bearer <key>``.
"""

from __future__ import annotations

import http.client
import json
import random
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from urllib.parse import urlsplit

from spinf._version import __version__
from spinf.bulk.errors import BulkError, BulkInputError, RemoteApiError

TRIES = 6
TIMEOUT_S = 120.0


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, req, fp, code, msg, headers, newurl):
        return None  # urllib then raises HTTPError with the 3xx, which we report


def score_url(url: str) -> str:
    """The ``/v1/score`` URL of a server root (a URL already ending in ``/v1/score`` is kept)."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise BulkInputError(f"--url {url!r} is not an http:// or https:// URL")
    root = url.rstrip("/")
    return root if root.endswith("/v1/score") else root + "/v1/score"


def retry_wait(retry_after: str | None, attempt: int) -> float:
    """Seconds to wait before the next attempt, without jitter (api spec §12.2)."""
    if retry_after and retry_after.replace(".", "", 1).isdigit():
        return min(120.0, float(retry_after))
    return min(60.0, 2.0**attempt)


def _refusal(status: int, headers, payload: bytes) -> RemoteApiError:
    error: dict = {}
    request_id = None
    if (headers.get("Content-Type") or "").startswith("application/json"):
        try:
            body = json.loads(payload)
        except ValueError:
            body = None
        if isinstance(body, dict) and isinstance(body.get("error"), dict):
            error, request_id = body["error"], body.get("request_id")
    message = error.get("message") or payload[:500].decode("utf-8", "replace") or f"HTTP {status}"
    return RemoteApiError(status, error.get("code") or "error", error.get("param"), message, request_id=request_id)


class HttpScorer:
    """``scorer(body) -> response`` against one server; see the module docstring for retries."""

    def __init__(self, url: str, *, token: str | None, timeout: float, tries: int, sleep: Callable[[float], None]):
        self.url = score_url(url)
        self._headers = {"Content-Type": "application/json", "User-Agent": f"spinf-serve/{__version__} score"}
        if token:
            self._headers["Authorization"] = f"Bearer {token}"
        self._timeout = timeout
        self._tries = tries
        self._sleep = sleep
        self._opener = urllib.request.build_opener(_NoRedirects)

    def _post(self, data: bytes) -> tuple[int, object, bytes]:
        request = urllib.request.Request(self.url, data=data, headers=self._headers, method="POST")
        try:
            with self._opener.open(request, timeout=self._timeout) as answer:
                return answer.status, answer.headers, answer.read()
        except urllib.error.HTTPError as answer:
            with answer:
                return answer.code, answer.headers, answer.read()

    def __call__(self, body: dict) -> dict:
        data = json.dumps(body).encode("ascii")
        last = ""
        for attempt in range(self._tries):
            wait = retry_wait(None, attempt)
            try:
                status, headers, payload = self._post(data)
            except (OSError, http.client.HTTPException) as exc:  # URLError, timeouts, resets, cut-off bodies
                last = f"{type(exc).__name__}: {exc}"
            else:
                if status == 200:
                    return self._decode(payload)
                if status != 429 and status < 500:
                    raise _refusal(status, headers, payload)
                wait = retry_wait(headers.get("Retry-After"), attempt)
                last = f"HTTP {status}: {payload[:200].decode('utf-8', 'replace')}"
            if attempt < self._tries - 1:
                self._sleep(wait + random.random())
        raise BulkError(f"POST {self.url} failed {self._tries} times; the last answer: {last}")

    def _decode(self, payload: bytes) -> dict:
        try:
            response = json.loads(payload)
        except ValueError as exc:
            raise BulkError(f"POST {self.url} answered 200 with a body that is not JSON") from exc
        if not isinstance(response, dict):
            raise BulkError(f"POST {self.url} answered 200 with JSON that is not an object")
        return response


def http_scorers(
    urls: Sequence[str],
    *,
    token: str | None = None,
    timeout: float = TIMEOUT_S,
    tries: int = TRIES,
    sleep: Callable[[float], None] = time.sleep,
) -> list[HttpScorer]:
    """One scorer per server URL (a server root such as ``http://10.0.0.5:8000``)."""
    if not urls:
        raise BulkInputError("no server URL given")
    return [HttpScorer(url, token=token, timeout=timeout, tries=tries, sleep=sleep) for url in urls]
