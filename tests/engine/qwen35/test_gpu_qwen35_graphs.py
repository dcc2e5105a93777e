"""CUDA graphs for the Qwen3.5 stack's scoring passes (spinf.engine.qwen35.graphs), gpu-marked: a pass replayed in
pieces around its recurrences (the pass's own graph, replayed at each GDN layer) gives the eager pass's bits, for
the tiny twin in bf16 and a tiny GPTQ folder in int4-i8, on contents short enough to run token by token and long
enough that their fixed prefix runs chunked."""

from __future__ import annotations

import pytest
import torch

from spinf import Engine
from tests.engine.qwen35.test_gpu_qwen35_engine import folders  # noqa: F401 - the tiny twin and its GPTQ folder
from tests.engine.test_gpu_graphs import eager
from tests.engine.test_independence import CONTENT, TARGETS, body, numbers, other_questions

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


@pytest.fixture(scope="module", params=["float", "i8"])
def gpu_engine(request, folders):  # noqa: F811 - the fixture imported above
    if request.param == "float":
        return Engine(str(folders[0]), device="cuda")
    return Engine(str(folders[1]), device="cuda", quant="i8")


@pytest.mark.parametrize("content", ["short", "chunked"])
def test_a_pass_replayed_in_pieces_gives_the_eager_bits(gpu_engine, content):
    text = "Where is my parcel? It was due on Monday." if content == "short" else CONTENT
    graphs = gpu_engine.scorer.graphs
    assert graphs is not None and gpu_engine.info()["cuda_graphs"]
    small = body(TARGETS, [("a", text)])
    replays = graphs.replays
    graphed = numbers(gpu_engine.score(small))
    assert graphs.replays > replays and not graphs.failed and graphs.captured
    # the pass's recurrences ran as one graph, captured at its first GDN layer (`PassRecurrence`)
    assert not graphs.recurrence_failed and graphs._recurrence.graph is not None
    assert graphed == eager(gpu_engine, small)
    crowd = body(other_questions(12) + TARGETS, [("z", "Other news."), ("a", text)])
    assert numbers(gpu_engine.score(crowd)) == eager(gpu_engine, crowd)  # another bucket, other jobs in the pass


def test_the_full_warm_up_captures_every_bucket(folders):  # noqa: F811
    from spinf.engine.graphs import all_buckets

    engine = Engine(str(folders[1]), device="cuda", quant="i8")
    for step in engine.warmup_steps("full"):
        step()
    assert engine.scorer.graphs.captured == all_buckets() and not engine.scorer.graphs.failed
