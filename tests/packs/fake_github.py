"""A fake GitHub REST API on loopback for the pack-source tests, and tarballs to serve (good ones and bad ones).

`FakeGitHub` answers what `spinf.packs.github` asks, as GitHub does: ``git/ref/tags/<ref>``, ``git/ref/heads/<ref>``,
``commits/<ref>`` (the bare SHA, for ``Accept: application/vnd.github.sha``) and ``tarball/<commit>``, which
redirects (302) to ``/codeload/...`` where the bytes are served. Anything unknown is GitHub's 404 JSON. Switches
make it misbehave: ``rate_limited`` (403 with the rate-limit headers), ``retry_after`` (429 with Retry-After),
``forbidden`` (a plain 403), ``server_error`` (502), ``sha_reply`` (a commit reply that is no SHA), ``private``
(404 without the right token), ``cut_transfer`` (a Content-Length larger than the bytes sent), ``no_length`` (a
tarball without a Content-Length); ``codeload`` sends the redirect to another fake. ``requests`` records every
request as ``(method, path, headers)``.
"""

from __future__ import annotations

import io
import tarfile
from urllib.parse import unquote

import attrs

from tests.loopback import JsonHandler, LoopbackServer

SHA_A = "a" * 40
SHA_B = "b" * 40
SHA_C = "c" * 40
NOT_FOUND = {"message": "Not Found", "documentation_url": "https://docs.github.com/rest", "status": "404"}


@attrs.define
class FakeRepo:
    """One repository: tags and branches (name -> commit), the default branch's commit, tarballs (commit -> bytes)."""

    tags: dict[str, str] = attrs.Factory(dict)
    branches: dict[str, str] = attrs.Factory(dict)
    default: str | None = None
    tarballs: dict[str, bytes] = attrs.Factory(dict)

    def commit_of(self, ref: str) -> str | None:
        if ref == "HEAD":
            return self.default
        if ref in self.tags or ref in self.branches:
            return self.tags.get(ref) or self.branches[ref]
        return ref if ref in self.tarballs else None


class _GitHubHandler(JsonHandler):
    def do_GET(self) -> None:
        fake: FakeGitHub = self.server.fake
        fake.requests.append(("GET", self.path, {k.lower(): v for k, v in self.headers.items()}))
        path = unquote(self.path.split("?")[0])
        if path.startswith("/codeload/"):
            self._tarball(path.removeprefix("/codeload/"))
            return
        if fake.rate_limited:
            headers = {"X-RateLimit-Limit": "60", "X-RateLimit-Remaining": "0", "X-RateLimit-Reset": str(fake.reset)}
            self.answer(403, {"message": "API rate limit exceeded for 127.0.0.1."}, headers)
            return
        if fake.retry_after is not None:  # a secondary rate limit
            self.answer(
                429, {"message": "You have exceeded a secondary rate limit."}, {"Retry-After": fake.retry_after}
            )
            return
        if fake.forbidden:
            self.answer(403, {"message": "Resource not accessible"}, {})
            return
        if path.startswith("/server-error/") or fake.server_error:
            self.answer(502, {"message": "Server Error"}, {})
            return
        self._api(path)

    def _api(self, path: str) -> None:
        fake: FakeGitHub = self.server.fake
        parts = path.removeprefix("/repos/").split("/", 2)
        name = "/".join(parts[:2])
        repo = fake.repos.get(name)
        if repo is None or len(parts) < 3 or not fake.authorized(name, self.headers.get("Authorization")):
            self.answer(404, NOT_FOUND, {})
            return
        rest = parts[2]
        for prefix, table in (("git/ref/tags/", repo.tags), ("git/ref/heads/", repo.branches)):
            if rest.startswith(prefix):
                ref = rest.removeprefix(prefix)
                if ref not in table:
                    self.answer(404, NOT_FOUND, {})
                else:
                    kind = "tags" if table is repo.tags else "heads"
                    body = {"ref": f"refs/{kind}/{ref}", "object": {"sha": table[ref], "type": "commit"}}
                    self.answer(200, body, {})
                return
        if rest.startswith("commits/"):
            self._commit(repo, rest.removeprefix("commits/"))
        elif rest.startswith("tarball/") and rest.removeprefix("tarball/") in repo.tarballs:
            location = f"{fake.codeload or fake.url}/codeload/{name}/tar.gz/{rest.removeprefix('tarball/')}"
            self.answer(302, b"", {"Location": location})
        else:
            self.answer(404, NOT_FOUND, {})

    def _commit(self, repo: FakeRepo, ref: str) -> None:
        commit = repo.commit_of(ref)
        if commit is None:
            self.answer(422, {"message": f"No commit found for SHA: {ref}"}, {})
        elif self.headers.get("Accept") == "application/vnd.github.sha":
            self.answer(200, self.server.fake.sha_reply or commit.encode(), {})
        else:
            self.answer(200, {"sha": commit}, {})

    def _tarball(self, rest: str) -> None:
        fake: FakeGitHub = self.server.fake
        owner, repo, _, commit = rest.split("/")
        data = fake.repos[f"{owner}/{repo}"].tarballs[commit]
        self.send_response(200)
        self.send_header("Content-Type", "application/x-gzip")
        if not fake.no_length:  # without it, HTTP/1.0 ends the body when the connection closes
            self.send_header("Content-Length", str(len(data) + (100 if fake.cut_transfer else 0)))
        self.end_headers()
        self.wfile.write(data)


class FakeGitHub(LoopbackServer):
    """GitHub's REST API on 127.0.0.1 for ``repos`` (``{"owner/repo": FakeRepo}``); ``private`` maps a repo to the
    token it needs. Point a client at it with ``SPINF_GITHUB_API=fake.url``."""

    def __init__(self, repos: dict[str, FakeRepo], private: dict[str, str] | None = None):
        super().__init__(_GitHubHandler)
        self.repos = dict(repos)
        self.private = dict(private or {})
        self.requests: list[tuple[str, str, dict[str, str]]] = []
        self.rate_limited = False
        self.forbidden = False
        self.retry_after: str | None = None
        self.server_error = False
        self.cut_transfer = False
        self.no_length = False
        self.codeload: str | None = None  # another fake's URL: the redirect then leaves this origin, as GitHub's does
        self.sha_reply: bytes | None = None
        self.reset = 1_900_000_000

    def authorized(self, name: str, authorization: str | None) -> bool:
        return name not in self.private or authorization == f"Bearer {self.private[name]}"

    def paths(self) -> list[str]:
        return [path for _, path, _ in self.requests]


def tarball(files: dict[str, bytes], *, top: str = "acme-packs-aaaaaaa", commit: str = SHA_A, extra=()) -> bytes:
    """A gzip tarball as GitHub makes it: a pax global header with the commit, one top folder, ``files`` under it
    (paths with ``/`` make their folders); ``extra`` are `tarfile.TarInfo` members added as they are (bad ones)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz", format=tarfile.PAX_FORMAT, pax_headers={"comment": commit}) as tar:
        tar.addfile(_info(f"{top}/", tarfile.DIRTYPE))
        folders = {f"{top}/{name.rsplit('/', 1)[0]}/" for name in files if "/" in name}
        for folder in sorted(folders):
            tar.addfile(_info(folder, tarfile.DIRTYPE))
        for name, data in files.items():
            info = _info(f"{top}/{name}", tarfile.REGTYPE)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        for info in extra:
            tar.addfile(info, io.BytesIO(b"x" * info.size) if info.size else None)
    return buffer.getvalue()


def member(name: str, kind: bytes = tarfile.REGTYPE, *, size: int = 0, target: str = "") -> tarfile.TarInfo:
    """A member for `tarball`'s ``extra``: a file of ``size`` bytes, or a link to ``target``, a device, a FIFO."""
    info = _info(name, kind)
    info.size = size
    info.linkname = target
    return info


def _info(name: str, kind: bytes) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.mode = 0o755 if kind == tarfile.DIRTYPE else 0o644
    info.mtime = 1_700_000_000
    return info


def bomb(size: int, *, top: str = "acme-packs-aaaaaaa") -> bytes:
    """A tarball whose one file is ``size`` zero bytes: tiny compressed, large extracted."""
    return tarball({"big.bin": bytes(size)}, top=top)
