"""The engine's identity: served names, fingerprint, and batch invariance only for catalog models."""

from __future__ import annotations

import hashlib

import pytest

from spinf import Engine, __version__
from spinf.errors import ApiError


def test_a_catalog_model_is_served_under_its_id_and_aliases(tiny_engine):
    assert tiny_engine.served_names == ("spinf/tiny-gemma4", "spinf/tiny-gemma4", "tiny")
    assert tiny_engine.batch_invariant
    body = {"model": "TINY", "messages": [{"content": "hi"}], "scoring": {"queries": []}}
    with pytest.raises(ApiError) as refused:  # the name matches; the body then has nothing to score
        tiny_engine.score(body)
    assert refused.value.code == "empty_queries"


def test_the_fingerprint_follows_the_spec_parts(tiny_engine, monkeypatch):
    parts = ["spinf/tiny-gemma4", tiny_engine.revision, "fp32", "unknown", __version__, "cpu", "fp32"]
    monkeypatch.delenv("GIT_SHA", raising=False)
    expected = "fp_" + hashlib.sha256("|".join(parts).encode()).hexdigest()[:10]
    assert tiny_engine._fingerprint() == expected


def test_a_checkpoint_outside_the_catalog_is_served_by_path_and_not_batch_invariant(tiny_engine):
    folder = str(tiny_engine.folder)
    engine = Engine(folder, device="cpu")
    assert engine.served_name == folder and engine.aliases == ()
    assert not engine.batch_invariant
    answer = engine.score(
        {
            "messages": [{"content": "hi"}],
            "scoring": {"queries": [{"id": "q", "template": "\n\nOk? Answer:{?}", "options": [" yes", " no"]}]},
        }
    )
    assert answer["model"] == folder


@pytest.mark.parametrize(
    ("device", "quant", "shares"),
    [
        ("cpu", "fp32", True),
        ("cuda", "fp8s", True),
        ("cuda", "int4-i8", True),  # the Qwen3.5 stack's default mode (engine spec B.10 item 8)
        ("cpu", "int4-i8", False),  # emulated on the CPU: not the kernels the claim rests on
        ("cuda", "int4-f16", False),
        ("cuda", "int4-fp8", False),
        ("cuda", "int4-bf16", False),
        ("cuda", "fp8", False),
        ("cuda", "bf16", False),
        ("cpu", "bf16", False),
    ],
)
def test_only_the_invariant_schemes_of_a_catalog_model_share_passes(device, quant, shares):
    import attrs
    import torch

    from spinf.catalog import resolve_model
    from spinf.engine.engine import batch_invariant

    catalog = resolve_model("spinf/qwen3.8-27b-int4")
    assert batch_invariant(catalog, torch.device(device), quant) is shares
    outside = attrs.evolve(catalog, manifest=None, batch_invariant=False)  # a checkpoint outside the catalog
    assert batch_invariant(outside, torch.device(device), quant) is False
