"""The test packs in ``fixtures/packs`` (for later end-to-end tests on the tiny model): the folder passes ``packs
validate``, the lock is spinf-client's, and spinf-client's evaluator runs on it (every read answered, views fed)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from spinf_client import packs as client

from spinf.packs.report import validate_folder
from spinf.packs.repository import scan_folder

FOLDER = Path(__file__).resolve().parents[2] / "fixtures" / "packs"


def test_the_fixture_folder_validates(capsys):
    assert validate_folder(str(FOLDER), sys.stdout, sys.stderr) == 0
    out, err = capsys.readouterr()
    assert err == "" and "tiny/moderation  0.1.0    spinf/tiny-gemma4  available  4        5        ok" in out


def test_the_tiny_moderation_pack_is_locked_and_evaluates_with_spinf_client():
    [loaded] = scan_folder(FOLDER).packs
    raw = json.loads((FOLDER / loaded.file).read_text())
    assert loaded.pack.model == "spinf/tiny-gemma4" and loaded.pack.lock_matches
    assert raw["decision"]["micro_layer"]["lock"] == client.lock_of(raw)
    result = {"input_id": "0", "queries": []}
    for query in loaded.pack.queries:
        n = len(query.options)
        options = [{"text": text, "logprob": -1.0 - j, "p": round(1 / n, 6)} for j, text in enumerate(query.options)]
        values = query.spec.get("combinations") or [{}]
        result["queries"].append({"id": query.id, "combinations": [{"values": v, "options": options} for v in values]})
    decision = client.evaluate(raw, client.answers_from_result(result, raw))["decision"]
    assert decision["mode"] == "micro_layer"
