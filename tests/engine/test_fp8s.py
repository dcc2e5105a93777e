"""fp8s on the tiny model (CPU emulation of the fp8 product): calibration, quantization, invariance, closeness."""

from __future__ import annotations

import pytest

from spinf import Engine
from spinf.engine.quant import AmaxRecorder
from tests.engine.test_independence import CONTENT, TARGETS, body, numbers, other_questions


@pytest.fixture(scope="module")
def fp8_engine(tiny_cache):
    engine = Engine("tiny", device="cpu", cache_dir=tiny_cache)
    recorder = AmaxRecorder()
    with engine.model.observing(recorder.observe):
        engine.score(body(other_questions(30) + TARGETS, [("a", CONTENT), ("b", "Where is my parcel? " * 20)]))
    assert set(recorder.amax) == set(engine.model.linear_names())
    engine.model.to_fp8s(recorder.scales())
    return engine


def test_every_linear_runs_in_fp8_after_quantization(fp8_engine):
    for layer in fp8_engine.model.layers:
        assert set(layer.fp8) == {"wqkv", "wo", "w_gate_up", "w_down"}
        assert layer.wqkv.weight.numel() == 0  # the float weights are released


def test_fp8s_scores_stay_close_to_fp32(fp8_engine, tiny_engine):
    exact = numbers(tiny_engine.score(body(TARGETS, [("a", CONTENT)])))
    quantized = numbers(fp8_engine.score(body(TARGETS, [("a", CONTENT)])))
    assert exact.keys() == quantized.keys()
    ps = [(exact[k][1], quantized[k][1]) for k in exact if len(exact[k]) == 3]
    assert max(abs(a - b) for a, b in ps) < 0.1  # e4m3 inputs and weights on a random 6-layer model (0.046 seen)


def test_fp8s_keeps_each_question_independent_of_its_neighbours(fp8_engine):
    alone = numbers(fp8_engine.score(body(TARGETS, [("a", CONTENT)])))
    crowded = numbers(fp8_engine.score(body(other_questions(200) + TARGETS, [("z", "Other."), ("a", CONTENT)])))
    assert crowded == alone


def test_a_scale_table_missing_a_linear_is_refused(tiny_cache):
    engine = Engine("tiny", device="cpu", cache_dir=tiny_cache)
    scales = dict.fromkeys(engine.model.linear_names()[1:], 1.0)
    with pytest.raises(Exception, match=r"^the scale table has no scale for 1 linears, e\.g\. layers\.0\.wqkv$"):
        engine.model.to_fp8s(scales)


def test_loading_with_scales_quantizes_each_layer_as_to_fp8s_does(tiny_engine):
    import torch

    from spinf.engine.gemma4.loading import load_gemma4_text

    scales = dict.fromkeys(tiny_engine.model.linear_names(), 0.5)
    while_loading = load_gemma4_text(tiny_engine.folder, scales=scales)
    afterwards = load_gemma4_text(tiny_engine.folder)
    afterwards.to_fp8s(scales)
    for a, b in zip(while_loading.layers, afterwards.layers, strict=True):
        assert a.fp8.keys() == b.fp8.keys() == {"wqkv", "wo", "w_gate_up", "w_down"}
        for name, (weight, scale) in a.fp8.items():
            other, other_scale = b.fp8[name]
            assert torch.equal(weight.data.view(torch.uint8), other.data.view(torch.uint8))
            assert (torch.equal(weight.scale, other.scale), scale) == (True, other_scale)
            assert getattr(a, name).weight.numel() == 0


def test_a_table_missing_a_linear_is_refused_before_loading(tiny_engine):
    from spinf.engine.gemma4.loading import load_gemma4_text

    scales = dict.fromkeys(tiny_engine.model.linear_names()[:-1], 0.5)
    with pytest.raises(Exception, match=r"^the scale table has no scale for 1 linears"):
        load_gemma4_text(tiny_engine.folder, scales=scales)
