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

import httpx
import pytest
import torch
from safetensors import safe_open

from contrib.fp8_static_checkpoint import E4M3_MAX, write_fp8_static
from spinf.engine.attention import AttentionPlan
from spinf.engine.gemma4.fp8_static import format_problem
from spinf.engine.gemma4.loading import load_gemma4_text
from spinf.errors import ModelError

compressed_tensors = pytest.importorskip("compressed_tensors")
INPUT_SCALE = 0.25  # every linear's input scale in the fixture; e4m3's range then covers |x| <= 112


def _ecosystem_checkpoint(src, dst, input_scale=INPUT_SCALE, targets=("Linear",)):
    """``src`` compressed as llm-compressor would leave it: transformers + compressed-tensors + save_pretrained,
    quantizing the ``targets`` (compressed-tensors' names: a class, a module name or ``re:`` a regex)."""
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

    scheme = QuantizationScheme(targets=list(targets), weights=args(), input_activations=args())
    # the media embedders stay bf16 (engine spec A.14.1), as a published checkpoint leaves them
    media = [
        name for name, m in model.named_modules() if name.startswith("model.embed_") and hasattr(m, "in_features")
    ]
    ignore = ["lm_head", *sorted(media)]
    apply_quantization_config(
        model, QuantizationConfig(config_groups={"group_0": scheme}, ignore=ignore, quantization_status="frozen")
    )
    for module in model.modules():
        if hasattr(module, "weight_scale"):  # what a min-max observer sets: amax / 448, and the calibrated input
            module.weight_scale.data.copy_(module.weight.detach().abs().amax() / E4M3_MAX)
            module.input_scale.data.fill_(input_scale)
    compressor = ModelCompressor.from_pretrained_model(model, quantization_format="float-quantized")
    compressor.compress_model(model)
    for name, tensor in [*model.named_parameters(), *model.named_buffers()]:  # back to bf16, all but the scales
        if tensor.dtype == torch.float32 and not name.endswith("_scale"):
            tensor.data = tensor.data.to(torch.bfloat16)
    model.save_pretrained(dst)
    compressor.update_config(str(dst))
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copy2(src / name, dst / name)
    return dst


@pytest.fixture(scope="module")
def bf16_folder(tiny_engine, tmp_path_factory):
    """The tiny model as a bf16 checkpoint: the kind of original a published fp8-static checkpoint is made from."""
    from safetensors.torch import load_file, save_file

    folder = tmp_path_factory.mktemp("bf16") / "tiny-bf16"
    shutil.copytree(tiny_engine.folder, folder)
    tensors = load_file(folder / "model.safetensors")
    save_file({k: v.to(torch.bfloat16) for k, v in tensors.items()}, folder / "model.safetensors", {"format": "pt"})
    config = _config(folder)
    config["dtype"] = "bfloat16"
    (folder / "config.json").write_text(json.dumps(config))
    return folder


@pytest.fixture(scope="module")
def fp8_folder(bf16_folder, tmp_path_factory):
    return _ecosystem_checkpoint(bf16_folder, tmp_path_factory.mktemp("fp8-static") / "tiny-fp8")


def _config(folder):
    return json.loads((folder / "config.json").read_text())


def test_the_ecosystem_layout_is_what_the_reader_accepts(fp8_folder):
    config = _config(fp8_folder)
    assert format_problem(config) is None
    with safe_open(str(fp8_folder / "model.safetensors"), framework="pt") as f:
        assert f.get_tensor("model.language_model.layers.0.self_attn.q_proj.weight").dtype == torch.float8_e4m3fn
        assert f.get_tensor("model.language_model.layers.0.self_attn.q_proj.input_scale").item() == INPUT_SCALE
        assert f.get_tensor("model.embed_vision.patch_dense.weight").dtype == torch.bfloat16


def test_our_shard_writer_writes_what_transformers_and_compressed_tensors_write(bf16_folder, fp8_folder, tmp_path):
    ours = write_fp8_static(bf16_folder, tmp_path / "ours", input_scale=INPUT_SCALE)
    theirs = _config(fp8_folder)["quantization_config"]
    mine = _config(ours)["quantization_config"]
    # the ignore list is a set of module names (compressed-tensors writes it in module order, lm_head last)
    assert sorted(mine.pop("ignore")) == sorted(theirs.pop("ignore"))
    assert mine == theirs
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
        (("config_groups", "group_0", "weights", "symmetric"), False, "weights.symmetric is False, not True"),
        (
            ("config_groups", "group_0", "input_activations", "dynamic"),
            "local",
            "input_activations.dynamic is 'local'",
        ),
        (("config_groups", "group_0", "targets"), "Linear", "targets are 'Linear', not a list of module classes"),
        (("config_groups", "group_0", "targets"), ["re:.*(q_proj"], "target 're:.*(q_proj' is not a regular exp"),
        (
            ("config_groups", "group_0", "targets"),
            ["re:.*self_attn\\..*", "re:.*mlp.(gate|up)_proj"],
            "the targets leave model.language_model.layers.0.mlp.down_proj unquantized",
        ),
        (
            ("ignore",),
            ["lm_head", "model.language_model.layers.5.self_attn.o_proj"],
            "the targets leave model.language_model.layers.5.self_attn.o_proj unquantized",
        ),
    ],
)
def test_any_other_quantization_config_is_refused_with_its_reason(fp8_folder, path, value, reason):
    problem = format_problem(_changed(_config(fp8_folder), path, value))
    assert problem is not None and reason in problem and "\n" not in problem


# Targets as regexes naming the decoder linears, as a recipe that quantizes the text model alone writes them.
REGEX_TARGETS = ("re:.*self_attn.(q|k|v|o)_proj", "re:.*mlp.gate_proj", "re:.*mlp.up_proj", "re:.*down_proj$")


@pytest.fixture(scope="module")
def regex_folder(bf16_folder, tmp_path_factory):
    return _ecosystem_checkpoint(bf16_folder, tmp_path_factory.mktemp("fp8-regex") / "tiny-fp8", targets=REGEX_TARGETS)


def _tensors(folder):
    with safe_open(str(folder / "model.safetensors"), framework="pt") as f:
        return {key: f.get_tensor(key) for key in f.keys()}  # noqa: SIM118 - safe_open is no dict


def test_regex_targets_naming_the_decoder_linears_load_as_the_linear_class_does(regex_folder, fp8_folder):
    """compressed-tensors writes the targets as given; the tensors are those of ``targets: ["Linear"]``."""
    group = _config(regex_folder)["quantization_config"]["config_groups"]["group_0"]
    assert group["targets"] == list(REGEX_TARGETS) and format_problem(_config(regex_folder)) is None
    ours, linear = _tensors(regex_folder), _tensors(fp8_folder)
    assert ours.keys() == linear.keys()
    assert all(torch.equal(ours[k].view(torch.uint8), linear[k].view(torch.uint8)) for k in ours if ours[k].dim())
    read, reference = load_gemma4_text(regex_folder, scheme="fp8s"), load_gemma4_text(fp8_folder, scheme="fp8s")
    for a, b in zip(read.layers, reference.layers, strict=True):
        assert a.fp8.keys() == b.fp8.keys() == {"wqkv", "wo", "w_gate_up", "w_down"}
        assert all(a.fp8[n][1] == b.fp8[n][1] == INPUT_SCALE for n in a.fp8)


@pytest.mark.parametrize("symmetric", [None, "absent"])
def test_symmetric_null_or_absent_is_read_as_compressed_tensors_default(fp8_folder, tmp_path, symmetric):
    """A null or missing ``symmetric`` (and a missing ``dynamic``) means compressed-tensors' default, symmetric and
    static: the reference engine does not read the field at all."""
    folder = tmp_path / "tiny-fp8"
    shutil.copytree(fp8_folder, folder)
    config = _config(folder)
    group = config["quantization_config"]["config_groups"]["group_0"]
    group["targets"] = ["re:.*self_attn.*_proj", "Linear"]
    for part in ("weights", "input_activations"):
        group[part].pop("dynamic")
        if symmetric == "absent":
            group[part].pop("symmetric")
        else:
            group[part]["symmetric"] = None
    (folder / "config.json").write_text(json.dumps(config))
    assert format_problem(config) is None
    model = load_gemma4_text(folder, scheme="fp8s")
    assert all(scale == INPUT_SCALE for layer in model.layers for _, scale in layer.fp8.values())


def _table(folder):
    """The checkpoint's input scales as an fp8s scale table (the engine's fused linear names), as the reader takes
    them."""
    model = load_gemma4_text(folder, scheme="fp8s")
    return {layer.prefix + name: scale for layer in model.layers for name, (_, scale) in layer.fp8.items()}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_checkpoint_holds_the_same_weights_and_gives_the_same_bits_as_its_original_quantized_at_load(
    bf16_folder, fp8_folder, dtype
):
    read = load_gemma4_text(fp8_folder, dtype=dtype, scheme="fp8s")
    at_load = load_gemma4_text(bf16_folder, dtype=dtype, scales=_table(fp8_folder))
    for a, b in zip(read.layers, at_load.layers, strict=True):
        assert a.fp8.keys() == b.fp8.keys() == {"wqkv", "wo", "w_gate_up", "w_down"}
        for name, ((wa, sa), (wb, sb)) in ((n, (a.fp8[n], b.fp8[n])) for n in a.fp8):
            assert sa == sb == INPUT_SCALE, name
            assert torch.equal(wa.data.view(torch.uint8), wb.data.view(torch.uint8)), name
            assert torch.equal(wa.scale, wb.scale), name
        assert a.wqkv.weight.numel() == 0  # no float copy of an fp8 linear is kept
    ids = torch.randint(3, 8192, (57,), generator=torch.Generator().manual_seed(5))
    with torch.inference_mode():
        got = read.read_logprobs(read(ids, AttentionPlan.for_sequence(57)))
        expected = at_load.read_logprobs(at_load(ids, AttentionPlan.for_sequence(57)))
    assert torch.equal(got, expected)


def test_other_schemes_read_the_checkpoint_dequantized(fp8_folder):
    """bf16/fp32 and the schemes that quantize themselves get each row's fp8 weight times its scale."""
    fp32 = load_gemma4_text(fp8_folder, dtype=torch.float32, scheme="fp32")
    fp8s = load_gemma4_text(fp8_folder, dtype=torch.float32, scheme="fp8s")
    for a, b in zip(fp32.layers, fp8s.layers, strict=True):
        assert not a.fp8 and a.wqkv.weight.dtype == torch.float32
        assert torch.equal(a.wqkv.weight, b.fp8["wqkv"][0].dequantized())


def test_a_damaged_checkpoint_is_refused_naming_the_tensor(fp8_folder, tmp_path):
    from safetensors.torch import load_file, save_file

    broken = tmp_path / "broken"
    shutil.copytree(fp8_folder, broken)
    tensors = load_file(broken / "model.safetensors")
    tensors["model.language_model.layers.2.mlp.up_proj.weight_scale"] = torch.tensor([0.5, 0.5])
    del tensors["model.language_model.layers.3.self_attn.o_proj.input_scale"]
    save_file(tensors, broken / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ModelError, match=r"layers\.2\.mlp\.up_proj\.weight_scale: a tensor-strategy scale is one"):
        load_gemma4_text(broken, scheme="fp8s")
    tensors["model.language_model.layers.2.mlp.up_proj.weight_scale"] = torch.tensor([0.5])
    save_file(tensors, broken / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ModelError, match=r"lacks 'layers\.3\.self_attn\.o_proj\.input_scale'"):
        load_gemma4_text(broken, scheme="fp8s")
    config = _config(broken)
    config["quantization_config"]["config_groups"]["group_0"]["weights"]["strategy"] = "channel"
    (broken / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelError, match=r"not an fp8-static checkpoint this engine reads: .*weights\.strategy"):
        load_gemma4_text(broken, scheme="fp8s")


BODY = {
    "inputs": [
        {"id": "a", "messages": [{"content": "I was charged twice for my order. Please refund one payment."}]},
        {"id": "b", "messages": [{"content": "Where is my parcel? It is a week late. " * 6}]},
    ],
    "scoring": {
        "queries": [
            {
                "id": "refund",
                "template": "\n\nDoes the customer ask for a refund? Answer:{?}",
                "options": [" yes", " no"],
            },
            {"id": "tone", "template": "\n\nThe tone is{?}", "options": [" calm", " angry", " neutral"]},
        ]
    },
}


@pytest.fixture(scope="module")
def fp8_engine(fp8_folder):
    from spinf import Engine

    return Engine(str(fp8_folder), device="cpu")


def test_a_folder_in_the_format_is_served_by_path_as_fp8s_with_its_own_input_scales(fp8_engine):
    """On a CPU the folder runs through the e4m3 emulation; fingerprint part 8 is ``checkpoint`` (api spec §11)."""
    assert (fp8_engine.quant, fp8_engine.scale_table) == ("fp8s", "checkpoint")
    assert not fp8_engine.batch_invariant  # a folder carries no guarantee (api spec §9.6)
    assert all(set(layer.fp8) == {"wqkv", "wo", "w_gate_up", "w_down"} for layer in fp8_engine.model.layers)


def test_the_checkpoint_scores_bit_identically_to_its_bf16_original_in_fp8s_with_the_same_scales(
    fp8_engine, bf16_folder, fp8_folder, tmp_path
):
    from spinf import Engine
    from spinf.engine.scales import SHIPPED_TABLE, TABLE_FORMAT, write_table

    original = tmp_path / "original"
    shutil.copytree(bf16_folder, original)
    write_table({"format": TABLE_FORMAT, "scheme": "fp8s", "scales": _table(fp8_folder)}, original / SHIPPED_TABLE)
    at_load = Engine(str(original), device="cpu", quant="fp8s")
    assert at_load.scale_table not in (None, "checkpoint")
    assert json.dumps(fp8_engine.score(BODY)["results"]) == json.dumps(at_load.score(BODY)["results"])
    bf16 = Engine(str(fp8_folder), device="cpu", quant="bf16")  # the weights dequantized: close, other bits
    assert json.dumps(bf16.score(BODY)["results"]) != json.dumps(at_load.score(BODY)["results"])


def test_spinf_serve_serves_the_folder_over_a_socket(fp8_folder, fp8_engine, tmp_path):
    """``spinf-serve serve ./folder --device cpu`` as a user starts it, called with the published client."""
    from spinf_client import SpinfClient

    from contrib.loadtest.harness import ServerProcess

    server = ServerProcess(tmp_path, "--trusted-token", "boss", model=str(fp8_folder))
    try:
        auth = {"Authorization": "Bearer boss"}
        info = httpx.get(f"{server.url}/v0/info", headers=auth, timeout=30).json()
        client = SpinfClient(base_url=server.url, model=str(fp8_folder), api_key="boss")
        answer = httpx.post(f"{server.url}/v1/score", json=BODY, headers=auth, timeout=120).json()
        models = client.models()
    finally:
        assert server.stop() == 0
    assert json.dumps(answer["results"]) == json.dumps(fp8_engine.score(BODY)["results"])
    assert answer["system_fingerprint"] == fp8_engine.system_fingerprint
    engine = info.get("engine", info)
    assert (engine["quant"], engine["scale_table"]) == ("fp8s", "checkpoint"), info
    assert models
