"""Qwen3.5 checkpoints as transformers writes them (`tests.engine.qwen35.hf_checkpoint`): the default config names
no ``mrope_section``, and the engine reads its rotary parameters as transformers does (issue 35 item 3). Scores
equal transformers' forward of every prompt alone to 1e-4, in-process and served by path through a real server
process."""

from __future__ import annotations

import json

import httpx
import pytest

from contrib.loadtest.harness import ServerProcess
from spinf import Engine
from spinf.engine.qwen35.config import parse_qwen35_config, read_qwen35_config
from spinf.errors import ModelError
from tests.engine.qwen35.hf_checkpoint import check_scores, oracle_of, write_transformers_qwen35
from tests.engine.test_oracle import CHOSEN, text_input

BODY = {
    "inputs": [
        text_input("in0", "I was charged twice for one order and the parcel came late. Please refund one payment."),
        text_input("in1", ""),
    ],
    "scoring": {
        "queries": [
            {"id": "refund", "template": "\n\nA refund? Answer:{?}", "options": [" yes", " no"]},
            {"id": "tone", "template": " The tone is{?}", "options": [" positive", " negative", " very much so"]},
        ]
    },
}


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return write_transformers_qwen35(tmp_path_factory.mktemp("hf-qwen35"))


@pytest.fixture(scope="module")
def oracle(folder):
    return oracle_of(folder)


def test_the_default_config_reads_as_transformers_reads_it(folder):
    raw = json.loads((folder / "config.json").read_text())
    assert raw["model_type"] == "qwen3_5_text" and "mrope_section" not in raw["rope_parameters"]
    cfg, prefix = read_qwen35_config(folder)
    assert prefix == "model." and cfg.rotary_dim == 8 and cfg.rope_theta == 10_000.0
    assert cfg.mrope_section == (11, 11, 10)  # transformers' default, clipped to the 4 pairs by the interleaving


@pytest.mark.parametrize(
    ("rope", "top", "rotary_dim", "theta"),
    [
        ({}, {}, 8, 10_000.0),  # no rope_parameters at all: Qwen3_5TextConfig's defaults
        ({"rope_type": "default", "rope_theta": 5e6}, {"partial_rotary_factor": 0.5}, 16, 5e6),
        ({"type": "default", "partial_rotary_factor": 1.0}, {"rope_theta": 77.0}, 32, 77.0),  # legacy keys
    ],
)
def test_rotary_fields_fall_back_as_transformers_does(rope, top, rotary_dim, theta):
    from transformers import Qwen3_5TextConfig

    raw = {"head_dim": 32, **top} | ({"rope_parameters": rope} if rope else {})
    cfg = parse_qwen35_config(raw)
    theirs = Qwen3_5TextConfig.from_dict(raw).rope_parameters
    assert (cfg.rotary_dim, cfg.rope_theta) == (rotary_dim, theta)
    assert (int(32 * theirs["partial_rotary_factor"]), theirs["rope_theta"]) == (rotary_dim, theta)


@pytest.mark.parametrize(
    ("rope", "message"),
    [
        ({"rope_type": "yarn", "factor": 4.0}, r"rope_type 'yarn' is not supported \(default only\)"),
        ({"mrope_section": [4, 4]}, r"mrope_section \[4, 4\] is not three counts of rotary pairs"),
    ],
)
def test_other_rotary_schemes_are_refused_by_name(rope, message):
    with pytest.raises(ModelError, match=rf"^Qwen3.5 {message}"):
        parse_qwen35_config({"rope_parameters": rope})


@pytest.mark.parametrize("name", ["the cut", "grids and long options"])
def test_scores_equal_transformers(folder, oracle, name):
    body = CHOSEN[name]
    check_scores(Engine(str(folder), device="cpu").score(body), body, oracle)


def test_served_by_path_scores_equal_transformers(folder, oracle, tmp_path):
    server = ServerProcess(tmp_path / "server", model=str(folder))
    try:
        answer = httpx.post(f"{server.url}/v1/score", json={"model": str(folder), **BODY}, timeout=120)
        assert answer.status_code == 200, answer.text
        check_scores(answer.json(), BODY, oracle)
    finally:
        assert server.stop() == 0
