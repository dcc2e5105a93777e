"""A model name that resolves to nothing refuses the start (api spec §9.6): `check_findable` against a fake Hub on
loopback, and the real ``spinf-serve serve <unknown id>``, which must exit with one line before any server starts.
Nothing here reaches a network: ``HF_ENDPOINT`` is loopback, ``HF_HOME`` a folder of the test's own."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from spinf.catalog import resolve_model
from spinf.catalog.checkpoint import check_findable
from spinf.errors import ModelError

from .hub import FakeHub, closed_port, run_serve, write_checkpoint, write_snapshot

THERE = "acme/on-the-hub"
REVISION = "0123456789abcdef0123456789abcdef01234567"
OTHER = "1111111111111111111111111111111111111111"


@pytest.fixture
def hub(monkeypatch):
    """The fake Hub, holding ``THERE`` at ``REVISION``, as huggingface_hub's endpoint in this process."""
    with FakeHub({THERE: REVISION}) as fake:
        fake.serve_here(monkeypatch)
        yield fake


def refusal(tmp_path: Path, absent: str, name: str = "acme/nowhere") -> str:
    roots = f"{tmp_path / 'cache'}, {os.environ['HF_HOME']}/hub"
    return (
        f"unknown model {name!r}: it is no catalog id or alias and no folder, no cache root holds it ({roots}), and "
        f"{absent}; `spinf-serve models` lists the catalog"
    )


def check(name: str, tmp_path: Path, **kwargs) -> None:
    kwargs.setdefault("offline", False)
    check_findable(resolve_model(name), cache_dirs=[str(tmp_path / "cache")], **kwargs)


def test_a_repo_the_hub_has_passes(hub, tmp_path):
    check(THERE, tmp_path)
    check(THERE, tmp_path, revision=REVISION)
    assert hub.seen == [f"/api/models/{THERE}", f"/api/models/{THERE}/revision/{REVISION}"]


def test_a_repo_the_hub_does_not_have_is_refused_naming_it(hub, tmp_path):
    with pytest.raises(ModelError) as refused:
        check("acme/nowhere", tmp_path)
    absent = f"the Hub at {hub.url} has no model repo of that name (or a private one that HF_TOKEN gives no access to)"
    assert str(refused.value) == refusal(tmp_path, absent)
    assert hub.seen == ["/api/models/acme/nowhere"]


def test_a_revision_the_hub_does_not_have_is_refused(hub, tmp_path):
    with pytest.raises(ModelError) as refused:
        check(THERE, tmp_path, revision=OTHER)
    assert str(refused.value) == refusal(tmp_path, f"the Hub at {hub.url} has no revision {OTHER} of it", THERE)


def test_a_repo_in_a_cache_root_passes_without_asking_the_hub(hub, tmp_path):
    write_snapshot(tmp_path / "cache", "acme/nowhere", OTHER)
    check("acme/nowhere", tmp_path)
    check("acme/nowhere", tmp_path, revision=OTHER)
    assert hub.seen == []


def test_catalog_models_folders_and_a_model_dir_pass_without_asking_the_hub(hub, tmp_path):
    check("spinf-12b", tmp_path)  # not cached: its pinned download is the loader's business
    check(str(write_checkpoint(tmp_path / "folder")), tmp_path)
    check("acme/nowhere", tmp_path, model_dir=str(tmp_path / "folder"))
    assert hub.seen == []


def test_offline_the_hub_is_not_asked(hub, tmp_path):
    with pytest.raises(ModelError) as refused:
        check("acme/nowhere", tmp_path, offline=True)
    assert str(refused.value) == refusal(tmp_path, "downloads are off (HF_HUB_OFFLINE), so the Hub was not asked")
    assert hub.seen == []


def test_a_hub_that_cannot_be_reached_counts_as_not_having_it(tmp_path, monkeypatch):
    url = f"http://127.0.0.1:{closed_port()}"
    monkeypatch.setattr("huggingface_hub.constants.ENDPOINT", url)
    with pytest.raises(ModelError, match=rf"and the Hub at {url} cannot be reached \(\w+: .*\), which counts as not "):
        check("acme/nowhere", tmp_path)


# -- spinf-serve serve --------------------------------------------------------------------------------------------


def serve(name: str, tmp_path: Path, endpoint: str, **env: str) -> subprocess.CompletedProcess:
    """``spinf-serve serve NAME --device cpu`` with the Hub at ``endpoint`` and a home of its own."""
    return run_serve(tmp_path, endpoint, name, "--device", "cpu", HF_HUB_DISABLE_TELEMETRY="1", **env)


def test_serve_refuses_a_hub_id_the_hub_does_not_have_in_one_line(tmp_path):
    with FakeHub({THERE: REVISION}) as hub:
        done = serve("acme/nowhere", tmp_path, hub.url)
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == (
        f"spinf-serve: unknown model 'acme/nowhere': it is no catalog id or alias and no folder, no cache root holds "
        f"it ({tmp_path / 'home' / 'hub'}), and the Hub at {hub.url} has no model repo of that name (or a private one "
        "that HF_TOKEN gives no access to); `spinf-serve models` lists the catalog\n"
    )
    assert hub.seen == ["/api/models/acme/nowhere"]


def test_serve_refuses_when_the_hub_cannot_be_reached_and_says_so(tmp_path):
    done = serve("acme/nowhere", tmp_path, f"http://127.0.0.1:{closed_port()}")
    assert done.returncode == 2 and done.stderr.count("\n") == 1
    assert done.stderr.startswith("spinf-serve: unknown model 'acme/nowhere': ")
    assert " cannot be reached (" in done.stderr and done.stderr.endswith("lists the catalog\n")


def test_serve_refuses_offline_without_asking(tmp_path):
    with FakeHub({}) as hub:
        done = serve("acme/nowhere", tmp_path, hub.url, HF_HUB_OFFLINE="1")
    assert done.returncode == 2 and done.stderr.count("\n") == 1
    assert "downloads are off (HF_HUB_OFFLINE), so the Hub was not asked" in done.stderr
    assert hub.seen == []
