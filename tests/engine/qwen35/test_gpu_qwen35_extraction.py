"""Extraction and generation on the Qwen3.5 stack on a GPU (gpu-marked; engine spec B.14.4, C.1).

The tiny twin on CUDA, in bf16 and as a GPTQ folder in the i8 mode: the scoring pass keeps each prefix's recurrent
state (the kernel writes it at the prefix's end), every decode step replays its rows' paths from it in the kernel's
decode step, and the attention layers decode through the Triton kernel over the decoder's buffers. Checked: a
64-token generation gets at every step the bits of the same path scored as a branch; every slot's raw outcomes are
the same bits in six compositions (tests/engine/test_gpu_extraction.py's test, on this stack); a decode replayed
from a CUDA graph gives the eager steps' outcomes.
"""

from __future__ import annotations

import pytest
import torch

from spinf import Engine
from spinf.engine.qwen35.int4_write import write_gptq_checkpoint
from spinf.engine.qwen35.tiny import write_tiny_qwen35
from tests.engine.extraction.probe import only
from tests.engine.extraction.probe import outcomes as recorded
from tests.engine.qwen35.test_qwen35_extraction import LONG_PATHS, check_a_long_generated_path
from tests.engine.test_gpu_extraction import (  # noqa: F401 - collected here, on the Qwen twin
    SLOTS,
    body,
    outcomes,
    test_every_slot_keeps_its_bits_in_six_compositions,
)
from tests.engine.test_independence import CONTENT

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("qwen-gpu-extraction")
    float_folder = write_tiny_qwen35(root / "float")
    return {"float": float_folder, "int4": write_gptq_checkpoint(float_folder, root / "int4", outlier_channels=4)}


@pytest.fixture(scope="module", params=[("float", ""), ("int4", "i8")], ids=["bf16", "int4-i8"])
def gpu_engine(request, folders):
    which, quant = request.param
    engine = Engine(str(folders[which]), device="cuda", quant=quant)
    assert engine.features.extraction and engine.features.generation, engine.features
    return engine


@pytest.mark.parametrize(("content", "template"), LONG_PATHS)
def test_a_long_generated_path_gets_the_bits_of_the_same_path_scored_on_the_gpu(
    gpu_engine, monkeypatch, content, template
):
    check_a_long_generated_path(gpu_engine, monkeypatch, content, template)


def test_a_decode_replayed_from_cuda_graphs_gives_the_eager_outcomes(gpu_engine, monkeypatch):
    request = body(SLOTS, [("a", CONTENT)])
    seen = {}
    for graphs in (False, True):
        monkeypatch.setattr(gpu_engine.extractor, "graphs", graphs)
        with recorded(gpu_engine.loop) as found:
            gpu_engine.score(request)
        seen[graphs] = {q["id"]: (only(found, q["id"])[0].answers, only(found, q["id"])[0].sequences) for q in SLOTS}
    assert seen[True] == seen[False]
    assert seen[False]["name"][0], "the text slot found no answer"
