"""The engine settings that shape the loaded model and its passes: ``layers`` (only the first N decoder layers) and
``compile`` (CUDA graphs for small passes, or every pass eager)."""

from __future__ import annotations

import pytest
import torch

from spinf import Engine
from spinf.engine.graphs import PassGraphs
from spinf.engine.scorer import Scorer
from spinf.errors import ModelError

BODY = {
    "messages": [{"content": "My parcel never arrived. I want my money back."}],
    "scoring": {"queries": [{"id": "refund", "template": "\n\nRefund? Answer:{?}", "options": [" yes", " no"]}]},
}


def logprobs(engine: Engine) -> list[float]:
    options = engine.score(BODY)["results"][0]["queries"][0]["combinations"][0]["options"]
    return [option["logprob"] for option in options]


@pytest.fixture(scope="module")
def one_layer(tiny_cache):
    return Engine("spinf/tiny-gemma4", device="cpu", cache_dir=tiny_cache, layers=1)


def test_layers_loads_only_the_first_layers_and_scores_as_another_model(tiny_engine, one_layer):
    assert len(tiny_engine.model.layers) == tiny_engine.info()["layers"] > 1
    assert len(one_layer.model.layers) == one_layer.info()["layers"] == 1
    first = (tiny_engine.model.layers[0].wqkv.weight, one_layer.model.layers[0].wqkv.weight)
    assert torch.equal(*first)  # the same first layer, from the same checkpoint
    assert logprobs(one_layer) != logprobs(tiny_engine)


def test_a_truncated_model_has_its_own_fingerprint(tiny_engine, one_layer, monkeypatch):
    """Its scores are not the checkpoint's, so they are not comparable with them (api spec §11, ours beyond)."""
    assert one_layer.system_fingerprint != tiny_engine.system_fingerprint
    monkeypatch.setattr(one_layer, "layers", 0)  # the one part it adds, "layers 1"
    assert one_layer._fingerprint() == tiny_engine._fingerprint()


def test_layers_beyond_the_checkpoint_s_are_refused(tiny_engine, tiny_cache):
    count = len(tiny_engine.model.layers)
    with pytest.raises(ModelError, match=rf"the checkpoint has {count} layers, fewer than the {count + 1} asked$"):
        Engine("spinf/tiny-gemma4", device="cpu", cache_dir=tiny_cache, layers=count + 1)
    same = Engine("spinf/tiny-gemma4", device="cpu", cache_dir=tiny_cache, layers=count)
    assert logprobs(same) == logprobs(tiny_engine)


@pytest.mark.parametrize("graphs", [True, False])
def test_compile_false_builds_a_gpu_scorer_without_cuda_graphs(tiny_engine, graphs):
    """No CUDA needed: building a GPU scorer captures nothing yet (graphs are captured on first use)."""
    scorer = Scorer(tiny_engine.model, torch.device("cuda"), graphs=graphs)
    assert isinstance(scorer.graphs, PassGraphs) if graphs else scorer.graphs is None


def test_on_the_cpu_there_are_no_graphs_either_way(tiny_engine, tiny_cache):
    eager = Engine("spinf/tiny-gemma4", device="cpu", cache_dir=tiny_cache, compile=False)
    assert tiny_engine.scorer.graphs is None and eager.scorer.graphs is None
    assert tiny_engine.info()["cuda_graphs"] is eager.info()["cuda_graphs"] is False
    assert logprobs(eager) == logprobs(tiny_engine) and eager.system_fingerprint == tiny_engine.system_fingerprint


@pytest.mark.gpu
def test_compile_false_turns_the_cuda_graphs_off_on_a_gpu(tiny_cache):
    graphed = Engine("spinf/tiny-gemma4", device="cuda", cache_dir=tiny_cache)
    eager = Engine("spinf/tiny-gemma4", device="cuda", cache_dir=tiny_cache, compile=False)
    assert (graphed.info()["cuda_graphs"], eager.info()["cuda_graphs"]) == (True, False)


def test_max_pass_s_left_unset_is_the_cpus_half_second_and_a_value_given_is_kept(tiny_cache):
    assert Engine("spinf/tiny-gemma4", device="cpu", cache_dir=tiny_cache).loop.scheduler.max_pass_s == 0.5
    assert Engine("spinf/tiny-gemma4", device="cpu", cache_dir=tiny_cache, max_pass_s=0).loop.scheduler.max_pass_s == 0


@pytest.mark.parametrize(("environ", "given"), [({}, None), ({"SPINF_MAX_PASS_S": "0.5"}, 0.5)])
def test_from_settings_passes_max_pass_s_only_when_a_layer_gave_it(monkeypatch, environ, given):
    """Unset, the engine picks by device (0 on a GPU, whose full passes are short or pay a fixed cost per pass);
    given, even at the table's default, it is kept on either device."""
    from spinf.settings import load_settings

    seen = {}
    monkeypatch.setattr(Engine, "__init__", lambda self, model, **kwargs: seen.update(kwargs))
    Engine.from_settings(load_settings({"device": "cuda:0"}, environ))
    assert seen["max_pass_s"] == given
