"""Fetching a ``github:`` pack source through the GitHub REST API (packs spec §4.2), with httpx's sync client.

The ref is resolved to a commit (a 40-hex ref is one; a tag is cached in ``refs.json``; a branch is resolved at every
fetch, with a warning), the tarball of the commit is downloaded (GitHub answers with a redirect to it) and extracted
safely (`spinf.packs.tarball`) into the packs cache::

    <cache root>/<owner>/<repo>/refs.json        {tag: commit}
    <cache root>/<owner>/<repo>/<commit>/        the extracted tree

Environment: ``SPINF_PACKS_CACHE`` (else ``$XDG_CACHE_HOME/spinf-serve/packs``, ``~/.cache`` by default),
``GITHUB_TOKEN`` (sent as ``Authorization: Bearer`` when non-empty) and ``SPINF_GITHUB_API``, the API's base URL
(``https://api.github.com``; the tests point it at a fake on loopback).

Every failure is a `GitHubError` subclass with a one-line message naming the source: `NotFound` (404),
`RateLimited` (403/429 with the rate-limit headers, saying when it resets), `HttpError` (any other status),
`Unreachable` (no connection, a timeout, a cut transfer) and `BadTarball` (unsafe, too large, truncated, corrupt).
"""

from __future__ import annotations

import datetime
import json
import logging
import os
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from urllib.parse import quote

import attrs
import httpx

from spinf.packs.sources import GitHubSource, OpenedSource, SourceError, is_commit
from spinf.packs.tarball import ArchiveError, Limits, extract

log = logging.getLogger(__name__)

API_ENV = "SPINF_GITHUB_API"
DEFAULT_API = "https://api.github.com"
CACHE_ENV = "SPINF_PACKS_CACHE"
TOKEN_ENV = "GITHUB_TOKEN"
API_VERSION = "2022-11-28"
TIMEOUT_S = 120.0  # a read or write may take this long (a large tarball on a slow link)
CONNECT_TIMEOUT_S = 10.0  # a black-holed or firewalled address gives up after this, not after TIMEOUT_S
DEFAULT_LIMITS = Limits()
_PRIVATE_HINT = "a private repository needs GITHUB_TOKEN"


class GitHubError(SourceError):
    """A GitHub source that cannot be fetched."""


class NotFound(GitHubError):
    """404: no such repository, tag, branch or commit (or a private repository without a token)."""


class RateLimited(GitHubError):
    """403 or 429 with the rate-limit headers; ``resets_at`` is the reset time (epoch seconds) when GitHub says."""

    def __init__(self, message: str, resets_at: float | None):
        super().__init__(message)
        self.resets_at = resets_at


class HttpError(GitHubError):
    """Any other unexpected HTTP status."""


class Unreachable(GitHubError):
    """No connection, a timeout, too many redirects or a transfer cut short."""


class BadTarball(GitHubError):
    """A tarball that is unsafe, larger than the caps, truncated or corrupt."""


def cache_root(environ: Mapping[str, str] | None = None) -> Path:
    """``$SPINF_PACKS_CACHE``, else ``spinf-serve/packs`` under ``$XDG_CACHE_HOME`` (default ``~/.cache``)."""
    environ = os.environ if environ is None else environ
    if environ.get(CACHE_ENV, ""):
        return Path(environ[CACHE_ENV]).expanduser()
    xdg = environ.get("XDG_CACHE_HOME", "") or str(Path("~/.cache").expanduser())
    return Path(xdg).expanduser() / "spinf-serve" / "packs"


@attrs.define
class GitHub:
    """The GitHub client of the pack sources; a context manager that closes its connections. Build it with
    `from_environ`; ``client`` is an `httpx.Client` (the tests may pass one with another transport)."""

    api: str
    cache: Path
    client: httpx.Client
    limits: Limits = DEFAULT_LIMITS

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None, *, limits: Limits = DEFAULT_LIMITS) -> GitHub:
        environ = os.environ if environ is None else environ
        headers = {"User-Agent": "spinf-serve", "X-GitHub-Api-Version": API_VERSION}
        if environ.get(TOKEN_ENV, "").strip():
            headers["Authorization"] = f"Bearer {environ[TOKEN_ENV].strip()}"
        timeout = httpx.Timeout(TIMEOUT_S, connect=CONNECT_TIMEOUT_S)
        client = httpx.Client(headers=headers, timeout=timeout, follow_redirects=True)
        api = (environ.get(API_ENV, "") or DEFAULT_API).rstrip("/")
        return cls(api, cache_root(environ), client, limits)

    def __enter__(self) -> GitHub:
        return self

    def __exit__(self, *exc_info) -> None:
        self.client.close()

    def fetch(self, source: GitHubSource, *, refresh: bool = False) -> OpenedSource:
        """The source's folder in the cache, resolving its ref and downloading its tree when needed; ``refresh``
        resolves a cached tag again (``--packs-refresh``)."""
        commit, warnings = self.resolve(source, refresh=refresh)
        tree = self.repo_dir(source) / commit
        if not tree.is_dir():
            try:
                self._download(source, commit, tree)
            except OSError as error:
                raise SourceError(f"pack source {source.spec}: cannot write the packs cache: {error}") from None
        folder = tree.joinpath(*source.path.split("/")) if source.path else tree
        if not folder.is_dir():
            raise SourceError(
                f"pack source {source.spec}: no folder {source.path!r} in {source.owner}/{source.repo} at {commit}"
            )
        return OpenedSource(source, source.label(commit), folder, commit, warnings)

    def repo_dir(self, source: GitHubSource) -> Path:
        return self.cache / source.owner / source.repo

    def resolve(self, source: GitHubSource, *, refresh: bool = False) -> tuple[str, tuple[str, ...]]:
        """The commit the source's ref names, and the warnings to log (a branch is not pinned)."""
        ref = source.ref
        if ref is not None and is_commit(ref):
            return ref, ()
        refs = self._read_refs(source)
        if ref is not None and ref in refs and not refresh:
            return refs[ref], ()
        kind = "branch" if ref is None else self._ref_kind(source, ref)
        commit = self._commit(source, "HEAD" if ref is None else ref)
        if kind == "tag":
            try:
                self._write_refs(source, {**refs, ref: commit})
            except OSError as error:  # only a cache: the next start resolves the tag again
                log.warning("pack source %s: cannot remember the tag's commit: %s", source.spec, error)
            return commit, ()
        branch = "the default branch" if ref is None else f"the branch {ref!r}"
        warning = (
            f"pack source {source.spec} follows {branch}, now at commit {commit}; pin a tag to fetch the same"
            " packs at every start"
        )
        return commit, (warning,)

    def _ref_kind(self, source: GitHubSource, ref: str) -> str:
        for kind, folder in (("tag", "tags"), ("branch", "heads")):
            url = f"{self._repo_url(source)}/git/ref/{folder}/{quote(ref, safe='/')}"
            response = self._get(source, url, ok_404=True)
            if response.status_code != 404:
                return kind
        raise NotFound(
            f"pack source {source.spec}: no tag, branch or commit {ref!r} in {source.owner}/{source.repo}"
            f" (GET {url}: 404; a short SHA is not accepted; {_PRIVATE_HINT})"
        )

    def _commit(self, source: GitHubSource, ref: str) -> str:
        url = f"{self._repo_url(source)}/commits/{quote(ref, safe='/')}"
        response = self._get(source, url, accept="application/vnd.github.sha")
        commit = response.text.strip()
        if not is_commit(commit):
            raise HttpError(f"pack source {source.spec}: GET {url} answered {commit[:60]!r}, not a 40-hex commit")
        return commit

    def _repo_url(self, source: GitHubSource) -> str:
        return f"{self.api}/repos/{source.owner}/{source.repo}"

    def _get(self, source: GitHubSource, url: str, *, accept: str | None = None, ok_404: bool = False):
        headers = {"Accept": accept or "application/vnd.github+json"}
        try:
            response = self.client.get(url, headers=headers)
        except httpx.HTTPError as error:
            raise Unreachable(f"pack source {source.spec}: GET {url} failed: {_describe(error)}") from None
        if not (response.status_code == 404 and ok_404):
            check_status(source, url, response)
        return response

    def _download(self, source: GitHubSource, commit: str, tree: Path) -> None:
        """Downloads and extracts the commit's tarball beside ``tree``, then renames its top folder into place."""
        url = f"{self._repo_url(source)}/tarball/{commit}"
        log.info("pack source %s: fetching %s/%s at %s", source.spec, source.owner, source.repo, commit)
        tree.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=tree.parent, prefix=f".{commit[:12]}-") as scratch:
            archive = Path(scratch) / "tarball.tar.gz"
            self._save(source, url, archive)
            try:
                top = extract(archive, Path(scratch) / "tree", self.limits)
            except ArchiveError as error:
                raise BadTarball(f"pack source {source.spec}: GET {url}: {error}") from None
            try:
                os.rename(top, tree)
            except OSError:
                if not tree.is_dir():  # another process may have put the same tree in place first
                    raise

    def _save(self, source: GitHubSource, url: str, archive: Path) -> None:
        cap = self.limits.max_download_bytes
        too_large = BadTarball(f"pack source {source.spec}: GET {url}: the tarball is larger than {cap} bytes")
        try:
            with self.client.stream("GET", url, headers={"Accept": "application/vnd.github+json"}) as response:
                check_status(source, url, response)
                if int(response.headers.get("Content-Length", "0") or 0) > cap:
                    raise too_large
                size = 0
                with open(archive, "wb") as target:
                    for chunk in response.iter_bytes():
                        size += len(chunk)
                        if size > cap:
                            raise too_large
                        target.write(chunk)
        except httpx.HTTPError as error:
            raise Unreachable(f"pack source {source.spec}: GET {url} failed: {_describe(error)}") from None

    def _read_refs(self, source: GitHubSource) -> dict[str, str]:
        """The cached tags; an unreadable or damaged ``refs.json`` counts as empty (it is only a cache)."""
        try:
            refs = json.loads((self.repo_dir(source) / "refs.json").read_text())
        except (OSError, ValueError):
            return {}
        if not isinstance(refs, dict):
            return {}
        return {k: v for k, v in refs.items() if isinstance(k, str) and isinstance(v, str) and is_commit(v)}

    def _write_refs(self, source: GitHubSource, refs: dict[str, str]) -> None:
        """Writes ``refs.json`` atomically (a temporary file renamed over it)."""
        folder = self.repo_dir(source)
        folder.mkdir(parents=True, exist_ok=True)
        fd, temporary = tempfile.mkstemp(dir=folder, prefix=".refs-", suffix=".json")
        with os.fdopen(fd, "w") as file:
            json.dump(dict(sorted(refs.items())), file, indent=1)
        os.replace(temporary, folder / "refs.json")


def check_status(source: GitHubSource, url: str, response: httpx.Response) -> None:
    """Raises the `GitHubError` for a response that is not a success (after redirects were followed)."""
    status = response.status_code
    if status < 300:
        return
    where = f"pack source {source.spec}: GET {url}: {status} {response.reason_phrase}".rstrip()
    headers = response.headers
    if status in (403, 429) and (headers.get("x-ratelimit-remaining") == "0" or "retry-after" in headers):
        resets_at = _reset_time(headers)
        when = "at an unknown time" if resets_at is None else _when(resets_at)
        message = f"{where}; the GitHub API rate limit is reached, it resets {when} (GITHUB_TOKEN raises it)"
        raise RateLimited(message, resets_at)
    if status == 404:
        raise NotFound(f"{where}; no such repository or commit ({_PRIVATE_HINT})")
    if status in (401, 403):
        raise HttpError(f"{where} ({_PRIVATE_HINT})")
    raise HttpError(where)


def _reset_time(headers: httpx.Headers) -> float | None:
    try:
        if "x-ratelimit-reset" in headers:
            return float(headers["x-ratelimit-reset"])
        if "retry-after" in headers:
            return time.time() + float(headers["retry-after"])
    except ValueError:
        return None
    return None


def _when(resets_at: float) -> str:
    moment = datetime.datetime.fromtimestamp(resets_at, datetime.UTC)
    seconds = max(0, round(resets_at - time.time()))
    return f"at {moment:%Y-%m-%d %H:%M:%S} UTC (in {seconds // 60} min {seconds % 60} s)"


def _describe(error: httpx.HTTPError) -> str:
    return f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
