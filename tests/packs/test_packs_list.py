"""``spinf-serve packs list`` (packs spec §4.7) through the real command: the sources line, the table with the
default marked, the nothing-enabled line, the skipped versions, the official failure on stderr with exit 0, and the
catalog errors with their count and exit 1."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from spinf.cli import main
from tests.packs.fake_github import SHA_A, FakeGitHub, FakeRepo, tarball
from tests.packs.folders import MINIMAL, write

ROOT = Path(__file__).resolve().parents[2]
FIXTURE_PACKS = str(ROOT / "fixtures" / "packs")
MODEL = "spinf/gemma-4-12b-fp8"


def pack(pack_id: str = "acme/tone", v: str = "1.0.0", model: str = MODEL) -> dict:
    return {**MINIMAL, "pack": pack_id, "version": v, "model": model}


def folder(root: Path, *packs: dict) -> str:
    root.mkdir(parents=True, exist_ok=True)
    for raw in packs:
        write(root, f"{raw['pack'].replace('/', '_')}-{raw['version']}.json", raw)
    return str(root)


@pytest.fixture
def fake(monkeypatch, tmp_path):
    """A fake GitHub that every test's GitHub client talks to (never the network), its cache in tmp_path."""
    repo = FakeRepo(tags={"1.0": SHA_A}, tarballs={SHA_A: tarball({"p.json": json.dumps(pack("acme/gh")).encode()})})
    with FakeGitHub({"acme/packs": repo}) as server:
        monkeypatch.setenv("SPINF_GITHUB_API", server.url)
        monkeypatch.setenv("SPINF_PACKS_CACHE", str(tmp_path / "cache"))
        monkeypatch.delenv("GITHUB_TOKEN", raising=False)
        monkeypatch.delenv("SPINF_PACKS_OFFICIAL", raising=False)
        yield server


def run(capsys, *argv: str) -> tuple[int, list[str], list[str]]:
    code = main(["packs", "list", *argv])
    out, err = capsys.readouterr()
    return code, out.splitlines(), err.splitlines()


def test_the_fixture_pack(fake, capsys):
    code, out, err = run(capsys, "--no-official", "--packs", FIXTURE_PACKS)
    assert (code, err) == (0, [])
    label = f"local:{FIXTURE_PACKS}"
    assert out == [
        f"sources: {label}",
        "pack             version          model              status     source",
        f"tiny/moderation  0.1.0 (default)  spinf/tiny-gemma4  available  {label}",
    ]


def test_table_default_marked_and_skipped_versions(fake, capsys, tmp_path):
    a = folder(tmp_path / "a", pack(v="1.9.0"), pack(v="1.10.0"), pack("acme/x", model="other/m"))
    code, out, err = run(capsys, "--no-official", "--packs", a, "--packs", FIXTURE_PACKS, "--model", "spinf-12b")
    assert (code, err) == (0, [])
    assert out == [
        f"sources: local:{a}, local:{FIXTURE_PACKS}",
        "pack       version           model                  status     source",
        f"acme/tone  1.10.0 (default)  spinf/gemma-4-12b-fp8  available  local:{a}",
        f"acme/tone  1.9.0             spinf/gemma-4-12b-fp8  available  local:{a}",
        "skipped (2):",
        f"  acme/x 1.0.0 from local:{a}: written for the model other/m, not the served model spinf-12b",
        f"  tiny/moderation 0.1.0 from local:{FIXTURE_PACKS}: written for the model spinf/tiny-gemma4, not the served"
        " model spinf-12b",
    ]


def test_nothing_enabled(fake, capsys, tmp_path):
    assert run(capsys, "--no-official") == (0, ["sources: none", "no pack version is enabled"], [])
    code, out, _ = run(capsys, "--no-official", "--packs", FIXTURE_PACKS, "--model", "Spinf-12B")
    assert out[1] == "no pack version is enabled for the model Spinf-12B"


def test_reserved_namespace_names_allow_namespace(fake, capsys, tmp_path):
    a = folder(tmp_path / "a", pack("spinf/moderation"))
    code, out, err = run(capsys, "--no-official", "--packs", a)
    assert code == 0
    assert out[-1].startswith(f"  spinf/moderation 1.0.0 from local:{a}: the spinf/ namespace is reserved")
    assert out[-1].endswith("--allow-namespace spinf allows it from this source")
    code, out, err = run(capsys, "--no-official", "--packs", a, "--allow-namespace", "spinf")
    assert out[2].startswith("spinf/moderation  1.0.0 (default)")


def test_official_from_a_local_folder(fake, capsys, tmp_path, monkeypatch):
    official = folder(tmp_path / "official", pack("spinf/moderation"))
    monkeypatch.setenv("SPINF_PACKS_OFFICIAL", official)
    code, out, err = run(capsys)
    assert (code, err) == (0, [])
    assert out[0] == f"sources: local:{official}"
    assert out[2].startswith("spinf/moderation  1.0.0 (default)")


def test_official_from_the_fake_github(fake, capsys, monkeypatch):
    monkeypatch.setenv("SPINF_PACKS_OFFICIAL", "github:acme/packs@1.0")
    code, out, err = run(capsys, "--refresh")
    assert (code, err) == (0, [])
    assert out == [
        "sources: acme/packs@1.0",
        "pack     version          model                  status     source",
        "acme/gh  1.0.0 (default)  spinf/gemma-4-12b-fp8  available  acme/packs@1.0",
    ]


def test_unreachable_official_source_is_on_stderr_and_exits_0(fake, capsys, tmp_path):
    code, out, err = run(capsys, "--packs", FIXTURE_PACKS)  # the default spinfinc/spinf-prompts@0.1.0: a 404
    assert code == 0
    assert out[0] == f"sources: local:{FIXTURE_PACKS}"
    [line] = err
    assert line.startswith("the official pack source is unavailable: pack source github:spinfinc/spinf-prompts@0.1.0")
    fake.server_error = True
    code, out, err = run(capsys)
    assert code == 0 and out == ["sources: none", "no pack version is enabled"]
    assert "502" in err[0]


def test_catalog_errors_on_stderr_with_their_count_and_exit_1(fake, capsys, tmp_path):
    a = folder(tmp_path / "a", pack())
    b = folder(tmp_path / "b", pack(v="2.0.0"))
    missing = str(tmp_path / "missing")
    code, out, err = run(capsys, "--no-official", "--packs", a, "--packs", b, "--packs", missing)
    assert code == 1
    assert out[0] == f"sources: local:{a}, local:{b}, local:{missing}"
    assert len(err) == 3
    assert err[0].startswith("error: acme/tone 2.0.0 from local:") and "already comes from" in err[0]
    assert err[1] == f"error: pack source local:{missing}: no such folder"
    assert err[2] == "2 catalog errors"


def test_as_a_subprocess(fake, tmp_path):
    env = {**os.environ, "SPINF_PACKS_OFFICIAL": str(tmp_path / "missing")}
    done = subprocess.run(
        [sys.executable, "-m", "spinf", "packs", "list", "--packs", FIXTURE_PACKS, "--model", "tiny"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
    )
    assert done.returncode == 0
    assert done.stdout.splitlines()[2].startswith("tiny/moderation  0.1.0 (default)")
    assert done.stderr.startswith("the official pack source is unavailable")
    broken = folder(tmp_path / "broken")
    write(Path(broken), "bad.json", {"pack": "acme/bad", "scoring": {}})
    done = subprocess.run(
        [sys.executable, "-m", "spinf", "packs", "list", "--no-official", "--packs", broken],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
    )
    assert done.returncode == 1
    assert re.fullmatch(r"[1-9][0-9]* catalog errors?", done.stderr.splitlines()[-1])
    assert done.stderr.splitlines()[0].startswith(f"error: local:{broken}: bad.json")
