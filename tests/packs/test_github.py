"""The GitHub pack-source client (packs spec §4.2) against a fake GitHub REST API served over HTTP on 127.0.0.1."""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import subprocess
import tarfile
import time
from pathlib import Path

import pytest

from spinf.packs.github import (
    API_VERSION,
    BadTarball,
    GitHub,
    HttpError,
    NotFound,
    RateLimited,
    Unreachable,
    cache_root,
)
from spinf.packs.sources import SourceError, parse_source
from spinf.packs.tarball import Limits
from tests.catalog.hub import closed_port
from tests.packs.fake_github import SHA_A, SHA_B, SHA_C, FakeGitHub, FakeRepo, bomb, member, tarball

FILES = {"prompt-packs.json": b'{"format": 1}', "packs/tone/1.0.0.json": b'{"pack": "acme/tone"}'}


def _repos() -> dict[str, FakeRepo]:
    repo = FakeRepo(
        tags={"v1": SHA_A},
        branches={"main": SHA_B},
        default=SHA_B,
        tarballs={SHA_A: tarball(FILES), SHA_B: tarball({"b.json": b"{}"}, top="acme-packs-bbbbbbb")},
    )
    return {"acme/packs": repo}


@pytest.fixture
def fake():
    with FakeGitHub(_repos()) as server:
        yield server


def _client(fake: FakeGitHub, tmp_path: Path, limits: Limits | None = None, **env: str) -> GitHub:
    environ = {"SPINF_GITHUB_API": fake.url, "SPINF_PACKS_CACHE": str(tmp_path / "cache"), **env}
    return GitHub.from_environ(environ) if limits is None else GitHub.from_environ(environ, limits=limits)


def _source(spec: str):
    return parse_source(spec, environ={})


def test_tag_fetched_cached_and_refreshed(fake, tmp_path):
    with _client(fake, tmp_path) as github:
        opened = github.fetch(_source("github:acme/packs@v1"))
    tree = tmp_path / "cache" / "acme" / "packs" / SHA_A
    assert (opened.label, opened.folder, opened.commit, opened.warnings) == ("acme/packs@v1", tree, SHA_A, ())
    assert (tree / "packs" / "tone" / "1.0.0.json").read_bytes() == FILES["packs/tone/1.0.0.json"]
    assert json.loads((tree.parent / "refs.json").read_text()) == {"v1": SHA_A}
    assert sorted(p.name for p in tree.parent.iterdir()) == [SHA_A, "refs.json"]  # no scratch folder left
    assert fake.paths() == [
        "/repos/acme/packs/git/ref/tags/v1",
        "/repos/acme/packs/commits/v1",
        f"/repos/acme/packs/tarball/{SHA_A}",
        f"/codeload/acme/packs/tar.gz/{SHA_A}",
    ]
    _, _, headers = fake.requests[1]
    assert (headers["accept"], headers["user-agent"]) == ("application/vnd.github.sha", "spinf-serve")
    assert headers["x-github-api-version"] == API_VERSION and "authorization" not in headers

    fake.requests.clear()
    with _client(fake, tmp_path) as github:
        assert github.fetch(_source("github:acme/packs@v1")).folder == tree
    assert fake.requests == []  # a pinned tag: offline from the cache

    fake.repos["acme/packs"].tags["v1"] = SHA_C  # the tag moved
    fake.repos["acme/packs"].tarballs[SHA_C] = tarball({"c.json": b"{}"}, top="acme-packs-ccccccc")
    with _client(fake, tmp_path) as github:
        assert github.fetch(_source("github:acme/packs@v1"), refresh=True).commit == SHA_C
    assert fake.paths()[:2] == ["/repos/acme/packs/git/ref/tags/v1", "/repos/acme/packs/commits/v1"]
    assert json.loads((tree.parent / "refs.json").read_text()) == {"v1": SHA_C}


def test_branch_and_default_branch_are_resolved_every_time(fake, tmp_path):
    with _client(fake, tmp_path) as github:
        branch = github.fetch(_source("github:acme/packs@main"))
        fake.requests.clear()
        default = github.fetch(_source("github:acme/packs#/"))
    assert branch.label == "acme/packs@main" and branch.commit == SHA_B
    assert branch.warnings == (
        f"pack source github:acme/packs@main follows the branch 'main', now at commit {SHA_B}; pin a tag to fetch"
        " the same packs at every start",
    )
    assert default.label == "acme/packs@bbbbbbbbbbbb" and "follows the default branch" in default.warnings[0]
    assert fake.paths() == ["/repos/acme/packs/commits/HEAD"]  # the tree is cached, the branch is not
    assert not (tmp_path / "cache" / "acme" / "packs" / "refs.json").exists()


def test_commit_ref_needs_no_resolution_and_path_is_a_folder(fake, tmp_path):
    with _client(fake, tmp_path) as github:
        opened = github.fetch(_source(f"github:acme/packs@{SHA_A}#packs/tone/"))
        assert opened.folder == tmp_path / "cache" / "acme" / "packs" / SHA_A / "packs" / "tone"
        assert opened.label == f"acme/packs@{SHA_A}"
        with pytest.raises(
            SourceError, match=rf"^pack source github:acme/packs@v1#nope: no folder 'nope' in acme/packs at {SHA_A}$"
        ):
            github.fetch(_source("github:acme/packs@v1#nope"))
    assert fake.paths()[:2] == [f"/repos/acme/packs/tarball/{SHA_A}", f"/codeload/acme/packs/tar.gz/{SHA_A}"]


def test_token_is_sent_and_opens_a_private_repository(tmp_path):
    with FakeGitHub(_repos(), private={"acme/packs": "s3cret"}) as fake:
        with _client(fake, tmp_path) as github, pytest.raises(NotFound) as caught:
            github.fetch(_source("github:acme/packs@v1"))
        assert str(caught.value) == (
            "pack source github:acme/packs@v1: no tag, branch or commit 'v1' in acme/packs"
            f" (GET {fake.url}/repos/acme/packs/git/ref/heads/v1: 404; a short SHA is not accepted;"
            " a private repository needs GITHUB_TOKEN)"
        )
        with _client(fake, tmp_path, GITHUB_TOKEN=" s3cret\n") as github:
            assert github.fetch(_source("github:acme/packs@v1")).commit == SHA_A
    api_requests = [headers for _, path, headers in fake.requests if path.startswith("/repos/")][-3:]
    assert [headers.get("authorization") for headers in api_requests] == ["Bearer s3cret"] * 3


def _refused(github: GitHub, spec: str, error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        github.fetch(_source(spec))


def test_redirect_to_another_origin_drops_the_token(tmp_path):
    repos = _repos()
    with FakeGitHub(repos) as api, FakeGitHub(repos) as codeload:
        api.codeload = codeload.url
        with _client(api, tmp_path, GITHUB_TOKEN="s3cret") as github:
            assert github.fetch(_source("github:acme/packs@v1")).commit == SHA_A
    assert api.paths()[-1] == f"/repos/acme/packs/tarball/{SHA_A}"
    assert api.requests[-1][2]["authorization"] == "Bearer s3cret"
    [(_, path, headers)] = codeload.requests
    assert path == f"/codeload/acme/packs/tar.gz/{SHA_A}" and "authorization" not in headers


def test_not_found(fake, tmp_path):
    hint = r" \(a private repository needs GITHUB_TOKEN\)$"
    with _client(fake, tmp_path) as github:
        url = r"GET http://127\.0\.0\.1:\d+/repos/acme/nothing/commits/HEAD"
        _refused(
            github,
            "github:acme/nothing",
            NotFound,
            rf"^pack source github:acme/nothing: {url}: 404 Not Found; no such repository or commit{hint}",
        )
        _refused(
            github,
            "github:acme/packs@v9",
            NotFound,
            r"^pack source github:acme/packs@v9: no tag, branch or commit 'v9' in acme/packs",
        )
        _refused(
            github,
            f"github:acme/packs@{SHA_C}",
            NotFound,
            rf"^pack source github:acme/packs@{SHA_C}: GET .*/tarball/{SHA_C}: 404 Not Found;",
        )
    assert fake.paths()[1:3] == ["/repos/acme/packs/git/ref/tags/v9", "/repos/acme/packs/git/ref/heads/v9"]


def test_rate_limit_says_when_it_resets(fake, tmp_path):
    fake.rate_limited = True
    with _client(fake, tmp_path) as github, pytest.raises(RateLimited) as caught:
        github.fetch(_source("github:acme/packs@v1"))
    assert caught.value.resets_at == 1_900_000_000
    assert str(caught.value).startswith(
        f"pack source github:acme/packs@v1: GET {fake.url}/repos/acme/packs/git/ref/tags/v1: 403 Forbidden; the"
        " GitHub API rate limit is reached, it resets at 2030-03-17 17:46:40 UTC (in "
    )
    assert str(caught.value).endswith(" s) (GITHUB_TOKEN raises it)") and "\n" not in str(caught.value)


def test_secondary_rate_limit(fake, tmp_path):
    fake.retry_after = "120"
    with _client(fake, tmp_path) as github, pytest.raises(RateLimited) as caught:
        github.fetch(_source("github:acme/packs"))
    assert caught.value.resets_at == pytest.approx(time.time() + 120, abs=5)
    assert re.search(
        r": 429 Too Many Requests; the GitHub API rate limit is reached, it resets at .* UTC "
        r"\(in (1 min 5\d|2 min 0) s\)",
        str(caught.value),
    )


def test_forbidden_and_other_statuses(fake, tmp_path):
    where = r"^pack source github:acme/packs: GET .*/commits/HEAD"
    fake.forbidden = True
    with _client(fake, tmp_path) as github:
        _refused(
            github,
            "github:acme/packs",
            HttpError,
            rf"{where}: 403 Forbidden \(a private repository needs GITHUB_TOKEN\)$",
        )
        fake.forbidden, fake.server_error = False, True
        _refused(github, "github:acme/packs", HttpError, rf"{where}: 502 Bad Gateway$")
        fake.server_error, fake.sha_reply = False, b"<html>"
        _refused(github, "github:acme/packs", HttpError, rf"{where} answered '<html>', not a 40-hex commit$")


def test_unreachable(tmp_path):
    environ = {"SPINF_GITHUB_API": f"http://127.0.0.1:{closed_port()}", "SPINF_PACKS_CACHE": str(tmp_path)}
    with (
        GitHub.from_environ(environ) as github,
        pytest.raises(
            Unreachable,
            match=r"^pack source github:acme/packs@v1: GET http://127\.0\.0\.1:\d+/repos/acme/packs/git/ref/tags/v1 "
            r"failed: ConnectError: ",
        ),
    ):
        github.fetch(_source("github:acme/packs@v1"))


def test_cut_transfer(fake, tmp_path):
    fake.cut_transfer = True
    with (
        _client(fake, tmp_path) as github,
        pytest.raises(
            Unreachable,
            match=rf"^pack source github:acme/packs@v1: GET .*/tarball/{SHA_A} failed: RemoteProtocolError: ",
        ),
    ):
        github.fetch(_source("github:acme/packs@v1"))
    assert sorted(p.name for p in (tmp_path / "cache" / "acme" / "packs").iterdir()) == ["refs.json"]


def _bad(fake: FakeGitHub, data: bytes) -> None:
    fake.repos["acme/packs"].tarballs[SHA_A] = data


@pytest.mark.parametrize(
    ("data", "match"),
    [
        (
            tarball(FILES)[:-20],
            r"the tarball is truncated or corrupt "
            r"\(Compressed file ended before the end-of-stream marker was reached\)$",
        ),
        (tarball(FILES)[: len(tarball(FILES)) // 2], r"the tarball is truncated or corrupt \("),
        (b"not a tarball at all", r"the tarball is truncated or corrupt \(Not a gzipped file \(b'no'\)\)$"),
        (
            tarball({}, extra=[member("acme-packs-aaaaaaa/../escape", size=3)]),
            r"the tarball member 'acme-packs-aaaaaaa/\.\./escape' escapes its folder \('\.\.'\)$",
        ),
        (tarball({}, extra=[member("../escape", size=3)]), r"the tarball member '\.\./escape' escapes its folder"),
        (
            tarball({}, extra=[member("/etc/passwd", size=3)]),
            r"the tarball member '/etc/passwd' has an absolute path$",
        ),
        (
            tarball({}, extra=[member("acme-packs-aaaaaaa/link", tarfile.SYMTYPE, target="/etc")]),
            r"the tarball member 'acme-packs-aaaaaaa/link' is a link$",
        ),
        (
            tarball(
                {"a": b"1"}, extra=[member("acme-packs-aaaaaaa/b", tarfile.LNKTYPE, target="acme-packs-aaaaaaa/a")]
            ),
            r"the tarball member 'acme-packs-aaaaaaa/b' is a link$",
        ),
        (
            tarball({}, extra=[member("acme-packs-aaaaaaa/dev", tarfile.CHRTYPE)]),
            r"the tarball member 'acme-packs-aaaaaaa/dev' is a special file",
        ),
        (
            tarball({}, extra=[member("acme-packs-aaaaaaa/fifo", tarfile.FIFOTYPE)]),
            r"the tarball member .acme-packs-aaaaaaa/fifo. is a special file \(device, FIFO or other\)$",
        ),
        (
            tarball({}, extra=[member("other/file", size=1)]),
            r"the tarball has more than one top-level entry \(acme-packs-aaaaaaa, other\)$",
        ),
        (
            tarball({"a": b"1"}, extra=[member("acme-packs-aaaaaaa/a", size=1)]),
            r"the tarball member 'acme-packs-aaaaaaa/a' appears twice$",
        ),
    ],
)
def test_bad_tarballs(fake, tmp_path, data, match):
    _bad(fake, data)
    with (
        _client(fake, tmp_path) as github,
        pytest.raises(BadTarball, match=rf"^pack source github:acme/packs@v1: GET .*/tarball/{SHA_A}: {match}"),
    ):
        github.fetch(_source("github:acme/packs@v1"))
    assert sorted(p.name for p in (tmp_path / "cache" / "acme" / "packs").iterdir()) == ["refs.json"]
    assert not (tmp_path / "escape").exists() and not (tmp_path / "cache" / "escape").exists()


def test_caps(fake, tmp_path):
    small = Limits(max_download_bytes=10_000, max_tree_bytes=50_000, max_members=5)
    cases = [
        (bomb(60_000), r"the tarball's content is larger than 50000 bytes$"),
        (tarball({f"f{i}": b"1" for i in range(5)}), r"the tarball has more than 5 members$"),
        (tarball({"noise": random.Random(0).randbytes(20_000)}), r"the tarball is larger than 10000 bytes$"),
    ]
    for data, match in cases:
        _bad(fake, data)
        with (
            _client(fake, tmp_path, small) as github,
            pytest.raises(BadTarball, match=rf"^pack source github:acme/packs@v1: GET .*/tarball/{SHA_A}: {match}"),
        ):
            github.fetch(_source("github:acme/packs@v1"))
    fake.no_length = True  # the download cap also holds while the bytes come in
    with _client(fake, tmp_path, small) as github, pytest.raises(BadTarball, match=r"larger than 10000 bytes$"):
        github.fetch(_source("github:acme/packs@v1"))
    _bad(fake, tarball({f"f{i}": b"1" for i in range(3)}))
    with _client(fake, tmp_path, small) as github:
        assert sorted(p.name for p in github.fetch(_source("github:acme/packs@v1")).folder.iterdir()) == [
            "f0",
            "f1",
            "f2",
        ]


def test_cache_root():
    assert cache_root({"SPINF_PACKS_CACHE": "/srv/c", "XDG_CACHE_HOME": "/x"}) == Path("/srv/c")
    assert cache_root({"XDG_CACHE_HOME": "/x"}) == Path("/x/spinf-serve/packs")
    assert cache_root({"SPINF_PACKS_CACHE": "", "XDG_CACHE_HOME": ""}) == Path.home() / ".cache/spinf-serve/packs"


def test_damaged_refs_json_is_ignored(fake, tmp_path):
    folder = tmp_path / "cache" / "acme" / "packs"
    folder.mkdir(parents=True)
    (folder / "refs.json").write_text("{not json")
    with _client(fake, tmp_path) as github:
        assert github.fetch(_source("github:acme/packs@v1")).commit == SHA_A
    assert json.loads((folder / "refs.json").read_text()) == {"v1": SHA_A}


def test_unwritable_cache(fake, tmp_path, caplog):
    (tmp_path / "file").write_text("")
    environ = {"SPINF_GITHUB_API": fake.url, "SPINF_PACKS_CACHE": str(tmp_path / "file" / "cache")}
    with GitHub.from_environ(environ) as github, pytest.raises(SourceError) as caught:
        github.fetch(_source("github:acme/packs@v1"))
    assert str(caught.value).startswith("pack source github:acme/packs@v1: cannot write the packs cache: [Errno 20]")
    assert "cannot remember the tag's commit" in caplog.text


def _git_archive(folder: Path) -> bytes:
    """The tarball of a real git commit, as ``git archive`` makes it (GitHub's tarballs are made the same way)."""

    def git(*args: str) -> bytes:
        env = {"GIT_CONFIG_GLOBAL": "/dev/null", "GIT_CONFIG_NOSYSTEM": "1", "PATH": os.environ["PATH"]}
        return subprocess.run(["git", "-C", str(folder), *args], check=True, capture_output=True, env=env).stdout

    git("init", "-q")
    git("add", ".")
    git("-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "-q", "-m", "packs")
    return git("archive", "--format=tar.gz", "--prefix=acme-packs-1234567/", "HEAD")


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_a_git_archive_extracts(fake, tmp_path):
    repo = tmp_path / "repo"
    for name, data in FILES.items():
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        (repo / name).write_bytes(data)
    _bad(fake, _git_archive(repo))
    with _client(fake, tmp_path) as github:
        folder = github.fetch(_source("github:acme/packs@v1#packs")).folder
    assert (folder / "tone" / "1.0.0.json").read_bytes() == FILES["packs/tone/1.0.0.json"]
    (repo / "link").symlink_to("prompt-packs.json")
    _bad(fake, _git_archive(repo))
    fake.repos["acme/packs"].tags["v2"] = SHA_C
    fake.repos["acme/packs"].tarballs[SHA_C] = fake.repos["acme/packs"].tarballs[SHA_A]
    with _client(fake, tmp_path) as github, pytest.raises(BadTarball, match=r"'acme-packs-1234567/link' is a link$"):
        github.fetch(_source("github:acme/packs@v2"))
