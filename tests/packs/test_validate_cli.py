"""``spinf-serve packs validate FOLDER`` (packs spec §4.8) through the real command: the header, the table, the
coming-soon lines, problems on stderr with their count and exit 1, and exit 0 on a good or missing folder."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from spinf.cli import main
from spinf.packs.manifest import MANIFEST_NAME
from spinf.packs.report import table
from tests.packs.folders import FIXTURES, MINIMAL, entry, manifest, tone, version, write

ROOT = Path(__file__).resolve().parents[2]


def run(capsys, *argv: str) -> tuple[int, list[str], list[str]]:
    code = main(["packs", "validate", *argv])
    out, err = capsys.readouterr()
    return code, out.splitlines(), err.splitlines()


def test_a_good_manifest_folder_prints_its_table_and_exits_0(capsys, tmp_path):
    write(tmp_path, "packs/tone/1.0.0.json", tone())
    write(tmp_path, "packs/off/1.0.0.json", {**MINIMAL, "pack": "acme/off-topic"})
    off = entry(
        "acme/off-topic", version(file="packs/off/1.0.0.json"), version("2.0.0", "x.json", status="coming_soon")
    )
    write(tmp_path, MANIFEST_NAME, manifest(entry(), off))
    code, out, err = run(capsys, str(tmp_path))
    assert (code, err) == (0, [])
    assert out == [
        f"{tmp_path}: {MANIFEST_NAME}, namespace acme",
        "pack            version  model                  status     queries  prompts  lock",
        "acme/tone       1.0.0    spinf/gemma-4-12b-fp8  available  3        4        ok",
        "acme/off-topic  1.0.0    spinf/gemma-4-12b-fp8  available  1        1        -",
        "coming soon: acme/off-topic 2.0.0",
        "2 pack versions, no problem",
    ]


def test_a_folder_with_several_kinds_of_problem_reports_each_and_exits_1(capsys, tmp_path):
    broken_lock = tone()
    broken_lock["reads"][0]["mean"] = -1.9
    write(tmp_path, "packs/tone/1.0.0.json", broken_lock)
    write(tmp_path, "packs/tone/1.1.0.json", tone(version="1.1.0", media=["image"]))
    listed = entry("acme/tone", version(), version("1.1.0", "packs/tone/1.1.0.json"), version("1.2.0", "gone.json"))
    write(tmp_path, MANIFEST_NAME, manifest(listed, entry("spinf/moderation")))
    code, out, err = run(capsys, str(tmp_path))
    assert code == 1
    assert out[1:] == [
        "pack       version  model                  status     queries  prompts  lock",
        "acme/tone  1.0.0    spinf/gemma-4-12b-fp8  available  3        4        MISMATCH",
    ]
    assert err == [
        "packs/tone/1.1.0.json: media: media must be a list holding 'text' plus any of 'image', 'audio', 'video'",
        f"{MANIFEST_NAME}: packs.0.versions.2.file: acme/tone 1.2.0: the file 'gone.json' does not exist in the "
        "folder",
        f"{MANIFEST_NAME}: packs.1: 'spinf/moderation' is not in the manifest's namespace 'acme'",
        "packs/tone/1.0.0.json: decision.micro_layer.lock: acme/tone 1.0.0: the lock does not match: the file was "
        "edited after the micro-layer was fitted (refit it, or restore the locked queries, reads and platt values)",
        "4 problems",
    ]


def test_discovery_without_a_manifest_and_a_missing_folder(capsys, tmp_path):
    code, out, err = run(capsys, str(FIXTURES))
    assert (code, err) == (0, [])
    assert out[0] == f"{FIXTURES}: no {MANIFEST_NAME}, pack files found by discovery"
    assert out[-1].endswith("pack versions, no problem") and len(out) > 3
    assert run(capsys, str(tmp_path / "none")) == (
        0,
        [
            f"{tmp_path / 'none'}: no {MANIFEST_NAME}, pack files found by discovery",
            "no pack files",
            "0 pack versions, no problem",
        ],
        [],
    )


def test_an_invalid_manifest_loads_nothing(capsys, tmp_path):
    write(tmp_path, "packs/tone/1.0.0.json", tone())
    write(tmp_path, MANIFEST_NAME, {"format": 1, "namespace": "acme"})
    code, out, err = run(capsys, str(tmp_path))
    assert code == 1
    assert out == [f"{tmp_path}: {MANIFEST_NAME} is invalid, nothing loaded", "no pack files"]
    assert err == [f"{MANIFEST_NAME}: the repository manifest is invalid: packs: a list is required", "1 problem"]


def test_the_table_pads_columns_and_trims_trailing_spaces():
    assert table([("a", "bb", ""), ("ccc", "d", "")]) == ["a    bb", "ccc  d"]


def test_the_installed_command_runs_it(tmp_path):
    write(tmp_path, "bad.json", {"pack": "x", "scoring": 1})
    done = subprocess.run(
        [sys.executable, "-m", "spinf", "packs", "validate", str(tmp_path)], capture_output=True, text=True, cwd=ROOT
    )
    assert done.returncode == 1
    assert done.stderr.splitlines()[-1] == "6 problems"
    usage = subprocess.run([sys.executable, "-m", "spinf", "packs"], capture_output=True, text=True, cwd=ROOT)
    assert usage.returncode == 2 and "PACKS_COMMAND" in usage.stderr
