"""spinf-serve calibrate: a scale table from a corpus (ours or the reference engine's format), the image and audio
folders and the parity fixture, under dynamic fp8 without compile, written to --out or the store keyed by checkpoint
revision."""

from __future__ import annotations

import base64
import gzip
import hashlib
import io
import json
import logging
import math
import wave

import pytest

from spinf.cli import _parser, main
from spinf.engine.calibrate import MEDIA_QUERY, calibrate, read_corpus
from spinf.engine.gemma4.tiny import TINY_REVISION
from spinf.engine.parity import read_fixture
from spinf.engine.quant import E4M3_MAX
from spinf.engine.scales import store_path

QUERY = {"id": "q", "template": "\n\nRefund? Answer:{?}", "options": [" yes", " no"]}
CORPUS = [
    {"messages": [{"content": "I was charged twice for my order."}], "scoring": {"queries": [QUERY]}},
    {"messages": [{"content": "Where is my parcel? " * 30}], "scoring": {"queries": [QUERY]}},
    {"messages": [{"content": "refused"}], "scoring": {"queries": [{**QUERY, "options": []}]}},  # too_many_options
]
BROKEN_IMAGE = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}  # 400 invalid_media


def reference_corpus(path, requests, testbed="v1"):
    """A corpus as the reference engine's calibration reads it: ``gzip.open(path, "rt")`` then ``json.load``,
    ``{"requests": [{"kind", "body"}]}`` with bodies in its request shape (``model``, ``inputs``, ``scoring``)."""
    with gzip.open(path, "wt") as f:
        json.dump({"testbed": testbed, "requests": requests}, f)
    return path


def reference_request(kind, inputs, model="spinf-12b"):
    return {"kind": kind, "body": {"model": model, "inputs": inputs, "scoring": {"queries": [QUERY]}}}


def text_input(id_, text):
    return {"id": id_, "messages": [{"role": "user", "content": text}]}


REFERENCE_REQUESTS = [
    reference_request("news-oil", [text_input("a", "Oil rose 4% on Tuesday."), text_input("b", "Ports shut. " * 40)]),
    # one input the engine refuses: the request is scored again input by input, the good one kept
    reference_request(
        "moderation",
        [text_input("c", "You are great."), {"id": "d", "messages": [{"role": "user", "content": [BROKEN_IMAGE]}]}],
    ),
    reference_request("odd", [{"id": "e", "messages": [{"role": "user", "content": [BROKEN_IMAGE]}]}]),
]


@pytest.fixture(scope="module")
def small_fixture(tmp_path_factory):
    """The built-in parity fixture cut to two jobs of two cells (as JSON: plain files are read too)."""
    fixture = read_fixture(None)
    fixture["jobs"] = [{**job, "cells": job["cells"][:2]} for job in fixture["jobs"][:2]]
    path = tmp_path_factory.mktemp("fixture") / "fixture.json"
    path.write_text(json.dumps(fixture))
    return path


def test_the_table_covers_every_linear_with_power_of_two_scales(tiny_engine):
    table = calibrate(tiny_engine, CORPUS, headroom=2.0, corpus_name="c.json")
    assert set(table["scales"]) == set(tiny_engine.model.linear_names()) == set(table["amax_from"])
    for name, scale in table["scales"].items():
        amax = table["amax"][name]
        assert math.log2(scale) == int(math.log2(scale)) and scale * E4M3_MAX >= 2 * amax > scale * E4M3_MAX / 2
    corpus = table["corpus"]
    assert (corpus["file"], corpus["inputs"], corpus["requests"], corpus["refused"]) == (
        "c.json",
        {"requests": 2},
        2,
        1,
    )
    assert corpus["tokens"] > 0 and (corpus["images"], corpus["audio"]) == (False, False)
    assert (table["model"], table["revision"], table["scheme"]) == ("spinf/tiny-gemma4", tiny_engine.revision, "fp8s")


def test_a_reference_corpus_is_read_as_the_reference_reads_it(tmp_path, caplog):
    path = reference_corpus(tmp_path / "v1.json.gz", [{**REFERENCE_REQUESTS[0], "weight": 3}])
    with caplog.at_level(logging.WARNING):
        corpus = read_corpus(path)
    assert [(r.kind, r.body["model"]) for r in corpus.requests] == [("news-oil", "spinf-12b")]
    assert (corpus.file, corpus.testbed) == ("v1.json.gz", "v1")
    assert corpus.sha256_12 == hashlib.sha256(path.read_bytes()).hexdigest()[:12]
    assert "requests.0: ignoring what calibration does not read: weight" in caplog.text


def test_the_reference_corpus_calibrates_refused_inputs_retried_one_by_one(tiny_engine, tmp_path, small_fixture):
    corpus = read_corpus(reference_corpus(tmp_path / "v1.json.gz", REFERENCE_REQUESTS))
    fixture = read_fixture(small_fixture)
    table = calibrate(tiny_engine, corpus, fixture=fixture)
    about = table["corpus"]
    # the other server's model name is dropped; d and e are refused (invalid_media), c is kept
    assert about["inputs"] == {"news-oil": 2, "moderation": 1, "fixture": 2}
    assert (about["requests"], about["refused"], about["testbed"]) == (2, 2, "v1")
    assert set(table["amax_from"].values()) <= {"news-oil", "moderation", "fixture"}
    without = calibrate(tiny_engine, corpus)
    assert about["tokens"] > without["corpus"]["tokens"]  # the fixture was scored too
    assert all(table["amax"][name] >= without["amax"][name] for name in without["amax"])


def png(seed: int) -> bytes:
    from PIL import Image

    pixels = bytes((seed * 37 + i * 11) % 256 for i in range(40 * 30 * 3))
    out = io.BytesIO()
    Image.frombytes("RGB", (40, 30), pixels).save(out, format="PNG")
    return out.getvalue()


def wav() -> bytes:
    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(16000)
        w.writeframes(b"".join(((i * 997) % 20000 - 10000).to_bytes(2, "little", signed=True) for i in range(8000)))
    return out.getvalue()


def test_the_reference_flags_and_their_defaults():
    args = _parser().parse_args(["calibrate", "--corpus", "c.json.gz"])
    assert (args.fixture, args.images, args.audio, args.n_images, args.n_audio) == (None, None, None, 24, 8)
    assert (args.headroom, args.out, args.device) == (2.0, None, None)


def test_the_command_reads_images_at_both_details_audio_and_the_fixture(
    tmp_path, monkeypatch, capsys, tiny_cache, small_fixture
):
    images, audio = tmp_path / "images", tmp_path / "audio"
    (images / "nested").mkdir(parents=True)
    audio.mkdir()
    for i in range(3):  # three of them, two drawn
        (images / "nested" / f"{i}.png").write_bytes(png(i))
    (images / "notes.txt").write_text("not an image")
    (audio / "clip.wav").write_bytes(wav())
    corpus = reference_corpus(tmp_path / "c.json.gz", REFERENCE_REQUESTS[:1])
    monkeypatch.setenv("SPINF_MODEL", "tiny")
    monkeypatch.setenv("SPINF_CACHE_DIRS", str(tiny_cache))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    out = tmp_path / "table.json"
    argv = [
        "calibrate",
        "--corpus",
        str(corpus),
        "--device",
        "cpu",
        "--fixture",
        str(small_fixture),
        "--out",
        str(out),
    ]
    assert main([*argv, "--images", str(images), "--audio", str(audio), "--n-images", "2", "--n-audio", "1"]) == 0
    table = json.loads(out.read_text())
    about = table["corpus"]
    assert about["inputs"] == {"news-oil": 2, "image/high": 2, "image/low": 2, "audio": 1, "fixture": 2}
    assert (about["images"], about["audio"], about["refused"]) == (True, True, 0)
    assert table["environment"]["quant"] == "fp8"  # dynamic fp8 (emulated on the CPU), whatever SPINF_QUANT says
    assert "news-oil 2, image/high 2, image/low 2, audio 1, fixture 2" in capsys.readouterr().out
    assert not store_path("spinf/tiny-gemma4", TINY_REVISION).exists()  # --out, not the store


def test_the_media_requests_ask_the_three_questions(tiny_engine, tmp_path):
    from spinf.engine.calibrate import media_requests

    (tmp_path / "a.png").write_bytes(png(1))
    (tmp_path / "b.wav").write_bytes(wav())
    requests = media_requests(tiny_engine, tmp_path, tmp_path, n_images=5, n_audio=5)
    assert [r.kind for r in requests] == ["image/high", "image/low", "audio"]
    assert all(r.body["scoring"]["queries"] == [MEDIA_QUERY] for r in requests)
    assert len(MEDIA_QUERY["combinations"]) == 3 and MEDIA_QUERY["options"] == [" Yes", " No"]
    part = requests[1].body["inputs"][0]["messages"][0]["content"][0]
    assert part["image_url"]["detail"] == "low" and part["image_url"]["url"].startswith("data:image/png;base64,")
    clip = requests[2].body["inputs"][0]["messages"][0]["content"][1]["input_audio"]
    assert (base64.b64decode(clip["data"]), clip["format"]) == (wav(), "wav")


def test_the_command_writes_to_the_store_of_the_checkpoint_revision(
    tmp_path, monkeypatch, capsys, tiny_cache, small_fixture
):
    corpus = tmp_path / "corpus.json.gz"
    corpus.write_bytes(gzip.compress(json.dumps({"requests": CORPUS}).encode()))
    monkeypatch.setenv("SPINF_MODEL", "tiny")
    monkeypatch.setenv("SPINF_CACHE_DIRS", str(tiny_cache))
    monkeypatch.setenv("SPINF_FIXTURE", str(small_fixture))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    assert main(["calibrate", "--corpus", str(corpus), "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    path = store_path("spinf/tiny-gemma4", TINY_REVISION)
    assert path == tmp_path / "hf" / "spinf" / "scales" / "spinf--tiny-gemma4" / f"{TINY_REVISION}.json"
    assert out.startswith(f"{path} (table ") and "2 requests scored, 1 inputs refused" in out
    assert json.loads(path.read_text())["corpus"]["inputs"] == {"requests": 2, "fixture": 2}


@pytest.mark.parametrize("flag", ["--images", "--audio"])
def test_a_media_folder_that_is_not_one_is_refused_before_the_load(tmp_path, capsys, flag):
    corpus = reference_corpus(tmp_path / "c.json.gz", REFERENCE_REQUESTS[:1])
    missing = tmp_path / "nowhere"
    assert main(["calibrate", "--corpus", str(corpus), flag, str(missing), "--device", "cpu"]) == 2
    assert capsys.readouterr().err == f"spinf-serve: {flag} {missing}: not a folder\n"


def test_a_bad_corpus_is_one_line_and_status_2(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    with pytest.raises(Exception, match=r'expected \{"requests": \[\{"kind", "body"\}, \.\.\.\]\} or a non-empty'):
        read_corpus(bad)
    assert main(["calibrate", "--corpus", str(bad), "--device", "cpu"]) == 2
    assert capsys.readouterr().err.count("\n") == 1
    missing = tmp_path / "missing.json.gz"
    assert main(["calibrate", "--corpus", str(missing), "--device", "cpu"]) == 2
    assert capsys.readouterr().err == f"spinf-serve: --corpus {missing}: cannot read it (No such file or directory)\n"
