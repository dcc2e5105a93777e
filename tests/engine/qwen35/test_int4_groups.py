"""GPTQ int4 checkpoints in any symmetric group size (issue 35 item 4): 32 (the published checkpoints'), 64, 128
(the Hub's most common) and whole rows (``group_size`` -1), quantized from a checkpoint transformers wrote
(`tests.engine.qwen35.hf_checkpoint`: every input width a multiple of 128), with the quantization configs gptqmodel,
auto_gptq and optimum write. Each is exact against its dequantized weights: unpacking equals the published GPTQ
formula, every mode gives the bits it gives on a float checkpoint of those weights, and that float checkpoint
scores as transformers' forward does to 1e-4. Served by path through a real server process, a group-128 folder
answers as the engine in-process."""

from __future__ import annotations

import json
import logging

import httpx
import pytest
import torch

from contrib.loadtest.harness import ServerProcess
from spinf import Engine
from spinf.engine.folder import read_tensors
from spinf.engine.layout import build_pass
from spinf.engine.qwen35.config import read_qwen35_config
from spinf.engine.qwen35.gptq import GptqConfig, read_gptq_config, unpack_gptq
from spinf.engine.qwen35.int4 import MODES, int4_linears
from spinf.engine.qwen35.int4_write import quantized_names, write_gptq_checkpoint
from spinf.engine.qwen35.model import load_qwen35
from spinf.engine.qwen35.outliers import read_outliers
from spinf.engine.scorer import one_cpu_thread
from spinf.engine.tiny_tokenizer import tokenizer_files
from spinf.errors import ModelError
from tests.engine.qwen35.hf_checkpoint import check_scores, oracle_of, write_transformers_qwen35
from tests.engine.qwen35.test_int4 import gptq_formula, job, write_dequantized
from tests.engine.test_oracle import text_input

GROUP_SIZES = [32, 64, 128, -1]
# quantization_config as each tool writes it (the values of a 4-bit, group-128, symmetric run without act-order)
AUTO_GPTQ = {  # auto_gptq 0.7's BaseQuantizeConfig.to_dict(), in quantize_config.json and config.json
    "bits": 4,
    "group_size": 128,
    "damp_percent": 0.01,
    "desc_act": False,
    "static_groups": False,
    "sym": True,
    "true_sequential": True,
    "model_name_or_path": None,
    "model_file_base_name": "model",
    "quant_method": "gptq",
    "checkpoint_format": "gptq",
}
OPTIMUM = {  # transformers' GPTQConfig.to_dict() after optimum's quantizer ran
    "quant_method": "gptq",
    "bits": 4,
    "tokenizer": None,
    "dataset": "c4",
    "group_size": 128,
    "damp_percent": 0.1,
    "desc_act": False,
    "act_group_aware": True,
    "sym": True,
    "true_sequential": True,
    "use_cuda_fp16": False,
    "model_seqlen": 2048,
    "block_name_to_quantize": "model.layers",
    "module_name_preceding_first_block": ["model.embed_tokens"],
    "batch_size": 1,
    "pad_token_id": None,
    "use_exllama": True,
    "max_input_length": None,
    "exllama_config": {"version": 1},
    "cache_block_outputs": True,
    "modules_in_block_to_quantize": None,
    "checkpoint_format": "gptq",
    "meta": None,
    "backend": None,
}
GPTQMODEL = {  # gptqmodel's QuantizeConfig.to_dict()
    "bits": 4,
    "dynamic": None,
    "group_size": 128,
    "desc_act": False,
    "sym": True,
    "lm_head": False,
    "quant_method": "gptq",
    "checkpoint_format": "gptq",
    "pack_dtype": "int32",
    "meta": {"quantizer": ["gptqmodel:4.0.0"], "uri": "https://github.com/modelcloud/gptqmodel", "damp_percent": 0.05},
}
BODY = {
    "inputs": [text_input("in0", "I was charged twice for one order. Please refund one payment.")],
    "scoring": {"queries": [{"id": "q", "template": "\n\nA refund? Answer:{?}", "options": [" yes", " no"]}]},
}


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    return write_transformers_qwen35(tmp_path_factory.mktemp("hf-float"))


@pytest.fixture(scope="module")
def written(source, tmp_path_factory):
    """group size -> (int4 folder, float folder of its dequantized weights)."""
    root = tmp_path_factory.mktemp("groups")
    out = {}
    for group in GROUP_SIZES:
        folder = write_gptq_checkpoint(source, root / f"g{group}", outlier_channels=8, group_size=group)
        dequantized = write_dequantized(folder, root / f"g{group}-dequantized")
        for name, data in tokenizer_files().items():
            (dequantized / name).write_bytes(data)
        out[group] = folder, dequantized
    return out


@pytest.fixture(autouse=True)
def _one_thread():
    with one_cpu_thread(torch.device("cpu")), torch.inference_mode():
        yield


def int4_model(folder, mode: str):
    gptq = read_gptq_config(folder)
    linears = int4_linears(read_tensors(folder, ""), mode, read_outliers(folder), group_size=gptq.group_size)
    return load_qwen35(folder, linear=linears)


@pytest.mark.parametrize("group", GROUP_SIZES)
def test_unpacking_equals_the_gptq_formula_at_every_group(written, group):
    folder, _ = written[group]
    assert read_gptq_config(folder) == GptqConfig(bits=4, group_size=group)
    raw = read_tensors(folder, "")
    cfg, prefix = read_qwen35_config(folder)
    for name in quantized_names(cfg.layer_types, prefix):
        width = raw[f"{name}.g_idx"].shape[0]
        size = width if group == -1 else group
        assert raw[f"{name}.scales"].shape[0] == width // size and raw[f"{name}.g_idx"][-1] == (width - 1) // size
        weight = unpack_gptq(raw, name, group)
        assert weight.group == size and torch.equal(weight.dequantize(), gptq_formula(raw, name)), name


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("group", GROUP_SIZES)
def test_every_mode_gives_the_dequantized_float_bits_at_every_group(written, group, mode):
    folder, dequantized = written[group]
    layout = build_pass([job(10), job(20)])
    got = int4_model(folder, mode).pass_logprobs(layout)
    expected = load_qwen35(
        dequantized, linear=int4_linears(read_tensors(dequantized, ""), mode, read_outliers(dequantized))
    )
    assert torch.equal(got, expected.pass_logprobs(layout))


@pytest.mark.parametrize("group", [128, -1])
def test_the_dequantized_weights_score_as_transformers_does(written, group):
    _, dequantized = written[group]
    response = Engine(str(dequantized), device="cpu").score(BODY)
    check_scores(response, BODY, oracle_of(dequantized))


@pytest.mark.parametrize("tool", [AUTO_GPTQ, OPTIMUM, GPTQMODEL], ids=["auto_gptq", "optimum", "gptqmodel"])
def test_configs_as_gptq_tools_write_them_load_at_group_128(source, written, tmp_path, tool):
    """The same tensors under each tool's config score the same bits as under our writer's."""
    folder = write_gptq_checkpoint(
        source, tmp_path / "q", outlier_channels=8, group_size=128, quantization_config=tool
    )
    assert json.loads((folder / "config.json").read_text())["quantization_config"] == tool
    assert read_gptq_config(folder).group_size == 128
    engine = Engine(str(folder), device="cpu", quant="bf16")
    assert engine.quant == "int4-bf16"
    ours = Engine(str(written[128][0]), device="cpu", quant="bf16")
    assert engine.score(BODY)["results"] == ours.score(BODY)["results"]


def test_a_group_size_the_tensors_do_not_have_is_refused(written, tmp_path):
    folder, _ = written[32]
    raw = read_tensors(folder, "")
    name = quantized_names(read_qwen35_config(folder)[0].layer_types, "model.")[0]
    with pytest.raises(ModelError, match=rf"^{name}: group size 48 does not divide its 128 inputs into even groups"):
        unpack_gptq(raw, name, 48)
    with pytest.raises(ModelError, match=rf"^{name}.qzeros: torch.int32 \(4, 32\), expected torch.int32 \(2, 32\)"):
        unpack_gptq(raw, name, 64)


def test_a_group_128_folder_served_by_path_answers_as_in_process(written, tmp_path):
    folder, _ = written[128]
    server = ServerProcess(tmp_path / "server", model=str(folder))
    try:
        answer = httpx.post(f"{server.url}/v1/score", json={"model": str(folder), **BODY}, timeout=120)
        assert answer.status_code == 200, answer.text
        assert answer.json()["results"] == Engine(str(folder), device="cpu").score(BODY)["results"]
    finally:
        assert server.stop() == 0


@pytest.mark.parametrize(
    ("group", "said"), [(128, "in groups of 128 inputs"), (-1, "in whole-row groups (group_size -1)")]
)
def test_the_start_up_log_names_the_checkpoint_s_own_group(written, group, said, caplog):
    """Every group size goes by one format name (``gptq-int4-g32``, the manifests'), shown nowhere; the log says
    the group the checkpoint has."""
    folder, _ = written[group]
    with caplog.at_level(logging.INFO, logger="spinf.engine.qwen35.loading"):
        engine = Engine(str(folder), device="cpu", quant="f16")
    assert engine.quant == "int4-f16"
    assert f"GPTQ int4 {said}, run as int4-f16" in caplog.messages
