"""The fp8-static checkpoint reader (engine spec B.8) against checkpoints written by compressed-tensors itself.

The fixture is the built-in tiny model compressed the way the ecosystem does it: transformers loads the checkpoint,
compressed-tensors applies the float-quantized scheme (weights and input activations: 8-bit float, tensor strategy,
static), compresses the model, and ``save_pretrained`` writes it, with compressed-tensors' own ``quantization_config``
in ``config.json``. Our shard-by-shard writer (contrib/fp8_static_checkpoint.py, which makes the big GPU checkpoints)
is checked against that same output byte for byte.
"""

from __future__ import annotations

import copy
import json
import shutil

import pytest
import torch
from safetensors import safe_open

from contrib.fp8_static_checkpoint import E4M3_MAX, write_fp8_static
from spinf.engine.fp8_static import format_problem

compressed_tensors = pytest.importorskip("compressed_tensors")
INPUT_SCALE = 0.25  # every linear's input scale in the fixture; e4m3's range then covers |x| <= 112


def _ecosystem_checkpoint(src, dst, input_scale=INPUT_SCALE):
    """``src`` compressed as llm-compressor would leave it: transformers + compressed-tensors + save_pretrained."""
    from compressed_tensors.compressors import ModelCompressor
    from compressed_tensors.quantization import (
        QuantizationArgs,
        QuantizationConfig,
        QuantizationScheme,
        apply_quantization_config,
    )
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32)

    def args():
        return QuantizationArgs(num_bits=8, type="float", strategy="tensor", symmetric=True, dynamic=False)

    scheme = QuantizationScheme(targets=["Linear"], weights=args(), input_activations=args())
    apply_quantization_config(
        model, QuantizationConfig(config_groups={"group_0": scheme}, ignore=["lm_head"], quantization_status="frozen")
    )
    for module in model.modules():
        if hasattr(module, "weight_scale"):  # what a min-max observer sets: amax / 448, and the calibrated input
            module.weight_scale.data.copy_(module.weight.detach().abs().amax() / E4M3_MAX)
            module.input_scale.data.fill_(input_scale)
    compressor = ModelCompressor.from_pretrained_model(model, quantization_format="float-quantized")
    compressor.compress_model(model)
    model.save_pretrained(dst)
    compressor.update_config(str(dst))
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copy2(src / name, dst / name)
    return dst


@pytest.fixture(scope="module")
def fp8_folder(tiny_engine, tmp_path_factory):
    return _ecosystem_checkpoint(tiny_engine.folder, tmp_path_factory.mktemp("fp8-static") / "tiny-fp8")


def _config(folder):
    return json.loads((folder / "config.json").read_text())


def test_the_ecosystem_layout_is_what_the_reader_accepts(fp8_folder):
    config = _config(fp8_folder)
    assert format_problem(config) is None
    with safe_open(str(fp8_folder / "model.safetensors"), framework="pt") as f:
        assert f.get_tensor("model.layers.0.self_attn.q_proj.weight").dtype == torch.float8_e4m3fn
        assert f.get_tensor("model.layers.0.self_attn.q_proj.input_scale").item() == INPUT_SCALE


def test_our_shard_writer_writes_what_transformers_and_compressed_tensors_write(tiny_engine, fp8_folder, tmp_path):
    ours = write_fp8_static(tiny_engine.folder, tmp_path / "ours", input_scale=INPUT_SCALE)
    theirs = _config(fp8_folder)["quantization_config"]
    assert _config(ours)["quantization_config"] == theirs
    with (
        safe_open(str(ours / "model.safetensors"), framework="pt") as a,
        safe_open(str(fp8_folder / "model.safetensors"), framework="pt") as b,
    ):
        assert set(a.keys()) == set(b.keys())
        for key in a.keys():
            x, y = a.get_tensor(key), b.get_tensor(key)
            assert x.dtype == y.dtype and x.shape == y.shape, key
            assert torch.equal(x.view(torch.uint8), y.view(torch.uint8)), key


def _changed(config, path, value):
    config = copy.deepcopy(config)
    node = config["quantization_config"]
    *parents, leaf = path
    for key in parents:
        node = node[key]
    node[leaf] = value
    return config


@pytest.mark.parametrize(
    ("path", "value", "reason"),
    [
        (("quant_method",), "gptq", "quant_method is 'gptq', not 'compressed-tensors'"),
        (("config_groups", "group_0", "weights", "strategy"), "channel", "weights.strategy is 'channel'"),
        (("config_groups", "group_0", "input_activations", "dynamic"), True, "input_activations.dynamic is True"),
        (("config_groups", "group_0", "input_activations"), None, "input_activations are not quantized"),
        (("config_groups", "group_0", "weights", "num_bits"), 4, "weights.num_bits is 4, not 8"),
        (("config_groups", "group_0", "weights", "type"), "int", "weights.type is 'int', not 'float'"),
        (("config_groups", "group_0", "format"), "pack-quantized", "format is 'pack-quantized'"),
        (("config_groups", "group_0", "output_activations"), {"num_bits": 8}, "output activations are quantized"),
        (("kv_cache_scheme",), {"num_bits": 8}, "kv_cache_scheme is set"),
        (("config_groups",), {}, "no config_groups"),
    ],
)
def test_any_other_quantization_config_is_refused_with_its_reason(fp8_folder, path, value, reason):
    problem = format_problem(_changed(_config(fp8_folder), path, value))
    assert problem is not None and reason in problem and "\n" not in problem
