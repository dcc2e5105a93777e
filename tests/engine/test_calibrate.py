"""spinf-serve calibrate: a scale table from a corpus, written to --out or the store keyed by checkpoint revision."""

from __future__ import annotations

import gzip
import json
import math

import pytest

from spinf.cli import main
from spinf.engine.calibrate import calibrate, read_corpus
from spinf.engine.quant import E4M3_MAX
from spinf.engine.scales import store_path

QUERY = {"id": "q", "template": "\n\nRefund? Answer:{?}", "options": [" yes", " no"]}
CORPUS = [
    {"messages": [{"content": "I was charged twice for my order."}], "scoring": {"queries": [QUERY]}},
    {"messages": [{"content": "Where is my parcel? " * 30}], "scoring": {"queries": [QUERY]}},
    {"messages": [{"content": "refused"}], "scoring": {"queries": [{**QUERY, "options": []}]}},  # too_many_options
]


def test_the_table_covers_every_linear_with_power_of_two_scales(tiny_engine):
    table = calibrate(tiny_engine, CORPUS, headroom=2.0, corpus_name="c.json")
    assert set(table["scales"]) == set(tiny_engine.model.linear_names())
    for name, scale in table["scales"].items():
        amax = table["amax"][name]
        assert math.log2(scale) == int(math.log2(scale)) and scale * E4M3_MAX >= 2 * amax
    assert table["corpus"] == {"file": "c.json", "requests": 2, "refused": 1, "tokens": table["corpus"]["tokens"]}
    assert (table["model"], table["revision"], table["scheme"]) == ("spinf/tiny-gemma4", tiny_engine.revision, "fp8s")


def test_the_command_writes_to_the_store_of_the_checkpoint_revision(tmp_path, monkeypatch, capsys, tiny_cache):
    corpus = tmp_path / "corpus.json.gz"
    corpus.write_bytes(gzip.compress(json.dumps({"requests": CORPUS}).encode()))
    monkeypatch.setenv("SPINF_MODEL", "tiny")
    monkeypatch.setenv("SPINF_CACHE_DIRS", str(tiny_cache))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    assert main(["calibrate", "--corpus", str(corpus), "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    from spinf.engine.tiny import TINY_REVISION

    path = store_path("spinf/tiny-gemma4", TINY_REVISION)
    assert path == tmp_path / "hf" / "spinf" / "scales" / "spinf--tiny-gemma4" / f"{TINY_REVISION}.json"
    assert out.startswith(f"{path} (table ") and "2 requests scored, 1 refused" in out
    assert json.loads(path.read_text())["corpus"]["requests"] == 2


def test_a_bad_corpus_is_one_line_and_status_2(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    with pytest.raises(Exception, match=r"expected a non-empty list of request bodies"):
        read_corpus(bad)
    assert main(["calibrate", "--corpus", str(bad), "--device", "cpu"]) == 2
    assert capsys.readouterr().err.count("\n") == 1
