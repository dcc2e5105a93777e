"""Int4 GPTQ checkpoints of the Qwen3.5 stack: the packed format, the config and outlier-table checks, the modes'
accuracy and their row invariance on the CPU (engine spec B.14.3, api spec §9.8).

Cross-check against a real GPTQ implementation, done once by hand (its wheel is no test dependency): auto_gptq
0.7.1's ``QuantLinear`` (``auto_gptq/nn_modules/qlinear/qlinear_cuda_old.py``, loaded by file path with this venv's
torch 2.13) packed the golden weight of `golden` (a linear whose weight is already on the grid, as GPTQ hands it
over; zero-points 8, ``g_idx = i // 32``). Its ``qweight``, ``qzeros`` and ``g_idx`` were equal to `pack_gptq`'s,
and its CPU forward with ``x = I`` (which dequantizes ``scales * (code - (stored zero + 1))``) gave exactly
`unpack_gptq`'s dequantized weight. The SHA-256 digests below are of auto_gptq's outputs. auto_gptq's ``pack``
does not clamp codes and sizes ``qzeros`` as ``out // 32 * 4`` words, so it needs outputs by 32 (gptqmodel 7.7.0's
``pack_original`` takes ``ceil``); gptqmodel's ``dequantize_weight`` and its v2 -> v1 conversion (``qzeros -=
0x11111111`` for 4 bits) were read, not run. Here the digests pin our packer to auto_gptq's bytes, and
`gptq_formula` (the published formula on the packed int32 tensors, without our code) checks our reader.
"""

from __future__ import annotations

import hashlib
import json
import shutil

import pytest
import torch
from safetensors.torch import save_file

from spinf.engine.folder import read_tensors
from spinf.engine.layout import build_pass
from spinf.engine.qwen35.gptq import GptqConfig, read_gptq_config, unpack_gptq
from spinf.engine.qwen35.int4 import ACT_BLOCK, MODES, Int4Linear, int4_linears, scheme
from spinf.engine.qwen35.int4_write import pack_gptq, quantize_rtn, write_gptq_checkpoint
from spinf.engine.qwen35.model import load_qwen35
from spinf.engine.qwen35.ops import rms_norm
from spinf.engine.qwen35.outliers import OUTLIERS_FILE, read_outliers
from spinf.engine.qwen35.tiny import TEXT_PREFIX, write_tiny_qwen35
from spinf.engine.scorer import one_cpu_thread
from spinf.engine.trie import Job, add_prompt
from spinf.errors import ModelError

CHANNELS = 8  # outlier channels per norm-fed linear in the tiny checkpoint (hidden size 64)
AUTO_GPTQ_QWEIGHT = "d61d784c4867f90f66d3aabb12203bd4240d5f65bcc52bc23527ce107ec903ab"
AUTO_GPTQ_QZEROS = "6ad7679ec6e044b8200b06a253a3c65dad6f01519c14739054aaedcb9b51ff9d"
AUTO_GPTQ_WEIGHT = "2eb6cf5732d33c1f76452c8e65c143e259218b2a1695c69303a48cddc46767eb"  # fp32 [out, in]
# |log-prob difference| over the full vocabulary against the float model of the dequantized weights, (max, mean),
# measured on the 6 prompts of these tests: bf16 (0.36, 0.040), f16 (0.050, 0.0046), fp8 (3.0, 0.39), i8 (0.66, 0.10);
# on 60 prompts: bf16 (0.35, 0.034), f16 (0.057, 0.0043), fp8 (4.1, 0.42), i8 (1.5, 0.11). The tiny random model is
# sharp (int4 rounding itself moves its log-probs by up to 6.6): the bounds are about 1.5 to 2 times the measure.
TOLERANCE = {"bf16": (0.6, 0.06), "f16": (0.1, 0.008), "fp8": (5.0, 0.6), "i8": (1.2, 0.16)}
LAYER = TEXT_PREFIX + "layers."
GROUPS = {  # one fused group of each kind in the tiny model (layer 0 is a GDN, layer 2 full attention)
    "gdn in": [f"{LAYER}0.linear_attn.in_proj_qkv", f"{LAYER}0.linear_attn.in_proj_z"],
    "gdn out": [f"{LAYER}0.linear_attn.out_proj"],
    "attention qkv": [f"{LAYER}2.self_attn.q_proj", f"{LAYER}2.self_attn.k_proj", f"{LAYER}2.self_attn.v_proj"],
    "attention out": [f"{LAYER}2.self_attn.o_proj"],
    "gate/up": [f"{LAYER}2.mlp.gate_proj", f"{LAYER}2.mlp.up_proj"],
    "down": [f"{LAYER}2.mlp.down_proj"],
}


@pytest.fixture(autouse=True)
def _one_thread():
    with one_cpu_thread(torch.device("cpu")), torch.inference_mode():
        yield


def gptq_formula(tensors: dict[str, torch.Tensor], name: str) -> torch.Tensor:
    """The published GPTQ v1 dequantization on the packed tensors, [out, in]: code i of a ``qweight`` column sits in
    word ``i // 8`` at bits ``4 (i % 8)``, the zero-point is the stored nibble plus 1, ``w = scale[g_idx] (code -
    zero[g_idx])`` (auto_gptq's CPU forward, gptqmodel's ``dequantize_weight``)."""
    qweight, qzeros, scales, g_idx = (tensors[f"{name}.{p}"] for p in ("qweight", "qzeros", "scales", "g_idx"))
    shifts = torch.arange(0, 32, 4, dtype=torch.int32)
    codes = ((qweight[:, None, :] >> shifts[None, :, None]) & 15).reshape(-1, qweight.shape[1])  # [in, out]
    zeros = ((qzeros[:, :, None] >> shifts[None, None, :]) & 15).reshape(qzeros.shape[0], -1) + 1  # [groups, out]
    g = g_idx.long()
    return (scales.float()[g] * (codes - zeros[g]).float()).t().contiguous()


def golden() -> tuple[torch.Tensor, torch.Tensor]:
    """Integer-built codes [64, 96] and fp16 scales [64, 3] (no random generator: the digests must hold anywhere)."""
    i = torch.arange(64 * 96).reshape(64, 96)
    g = torch.arange(64 * 3).reshape(64, 3)
    return ((i * 7 + i // 13) % 16).to(torch.int32), ((1 + g % 5).double() / 64 + g.double() / 4096).half()


def sha(tensor: torch.Tensor) -> str:
    return hashlib.sha256(tensor.contiguous().numpy().tobytes()).hexdigest()


def write_dequantized(int4_folder, folder):
    """A float checkpoint of the int4 one's dequantized weights (by `gptq_formula`), with its config (without the
    quantization_config) and its outlier table."""
    raw = read_tensors(int4_folder, "")
    tensors = {}
    for key, tensor in raw.items():
        if key.endswith(".qweight"):
            tensors[key.removesuffix(".qweight") + ".weight"] = gptq_formula(raw, key.removesuffix(".qweight"))
        elif not key.endswith((".qzeros", ".scales", ".g_idx")):
            tensors[key] = tensor
    folder.mkdir(parents=True)
    save_file(tensors, str(folder / "model.safetensors"))
    config = json.loads((int4_folder / "config.json").read_text())
    del config["quantization_config"]
    (folder / "config.json").write_text(json.dumps(config))
    shutil.copyfile(int4_folder / OUTLIERS_FILE, folder / OUTLIERS_FILE)
    return folder


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("int4")
    source = write_tiny_qwen35(root / "float")
    int4 = write_gptq_checkpoint(source, root / "int4", outlier_channels=CHANNELS)
    return {"float": source, "int4": int4, "dequantized": write_dequantized(int4, root / "dequantized")}


@pytest.fixture(scope="module")
def int4_raw(folders):
    return read_tensors(folders["int4"], "")


def tokens(seed: int, n: int) -> tuple[int, ...]:
    return tuple(torch.randint(3, 8192, (n,), generator=torch.Generator().manual_seed(seed)).tolist())


def job(seed: int) -> Job:
    out = Job(tokens(seed, 30))
    for k in range(3):
        add_prompt(out, tokens(seed + 1 + k, 3 + k), [(5,)])
    return out


def model_of(folder, mode: str):
    return load_qwen35(folder, linear=int4_linears(read_tensors(folder, ""), mode, read_outliers(folder)))


def test_packing_round_trips_the_codes():
    codes = torch.randint(0, 16, (24, 64), generator=torch.Generator().manual_seed(1), dtype=torch.int32)
    codes[:, 7::8] = 15  # every word's top nibble set: the int32 words are negative
    scales = torch.rand(24, 2, generator=torch.Generator().manual_seed(2)).half()
    packed = pack_gptq(codes, scales)
    assert packed["qweight"].dtype == torch.int32 and tuple(packed["qweight"].shape) == (8, 24)
    weight = unpack_gptq({f"x.{k}": v for k, v in packed.items()}, "x")
    assert weight.q.dtype == torch.uint8 and tuple(weight.q.shape) == (24, 32)
    assert torch.equal(weight.codes().int(), codes) and torch.equal(weight.scales, scales)
    assert torch.equal(weight.q & 15, codes[:, 0::2].to(torch.uint8))  # low nibble: the even input


def test_packing_and_dequantization_match_auto_gptq():
    codes, scales = golden()
    packed = pack_gptq(codes, scales)
    assert sha(packed["qweight"]) == AUTO_GPTQ_QWEIGHT and sha(packed["qzeros"]) == AUTO_GPTQ_QZEROS
    tensors = {f"x.{k}": v for k, v in packed.items()}
    weight = unpack_gptq(tensors, "x").dequantize()
    assert sha(weight) == AUTO_GPTQ_WEIGHT
    assert torch.equal(weight, gptq_formula(tensors, "x"))


def test_the_writer_rounds_to_nearest_on_gptqs_symmetric_grid():
    weight = torch.randn(16, 64, generator=torch.Generator().manual_seed(3))
    codes, scales = quantize_rtn(weight)
    amax = weight.reshape(16, 2, 32).abs().amax(-1)
    assert torch.equal(scales, (2 * amax / 15).half())
    step = scales.float().repeat_interleave(32, dim=1)
    error = (weight - step * (codes - 8)).abs()
    clamped = (
        codes == 15
    )  # only the positive end clamps: +amax is 7.5 steps (a little more: the fp16 scale's rounding)
    assert (error[~clamped] <= step[~clamped] * 0.5 * (1 + 1e-6)).all()
    assert (error[clamped] <= step[clamped] * (0.5 + 7.5 * 2**-11) * (1 + 1e-6)).all()
    assert codes.min() == 0 and codes.max() == 15


def test_the_written_checkpoint_has_gptqs_layout_and_config(folders, int4_raw):
    name = GROUPS["gdn in"][0]
    assert [int4_raw[f"{name}.{p}"].dtype for p in ("qweight", "qzeros", "scales", "g_idx")] == [
        torch.int32,
        torch.int32,
        torch.float16,
        torch.int32,
    ]
    assert tuple(int4_raw[f"{name}.qweight"].shape) == (8, 128) and f"{name}.weight" not in int4_raw
    assert f"{LAYER}0.linear_attn.in_proj_b.weight" in int4_raw and "lm_head.weight" in int4_raw
    assert read_gptq_config(folders["int4"]) == GptqConfig(bits=4, group_size=32)
    assert read_gptq_config(folders["float"]) is None
    config = json.loads((folders["int4"] / "config.json").read_text())
    assert json.loads((folders["int4"] / "quantize_config.json").read_text()) == config["quantization_config"]
    assert (folders["int4"] / "tokenizer.json").read_bytes() == (folders["float"] / "tokenizer.json").read_bytes()


def test_the_writer_is_deterministic(folders, tmp_path):
    again = write_gptq_checkpoint(folders["float"], tmp_path / "again", outlier_channels=CHANNELS)
    names = sorted(p.name for p in folders["int4"].iterdir())
    assert names == sorted(p.name for p in again.iterdir())
    for name in names:
        assert (again / name).read_bytes() == (folders["int4"] / name).read_bytes(), name


def config_with(folder, tmp_path, **changes):
    config = json.loads((folder / "config.json").read_text())
    quant = dict(config.pop("quantization_config"))
    for key, value in changes.items():
        if value is None:
            quant.pop(key, None)
        else:
            quant[key] = value
    config["text_config"]["quantization_config"] = quant  # the nested placement
    (tmp_path / "config.json").write_text(json.dumps(config))
    return tmp_path


@pytest.mark.parametrize(
    ("field", "value", "shown"),
    [
        ("bits", 8, "8"),
        ("group_size", 0, "0"),
        ("group_size", -2, "-2"),
        ("group_size", "128", "'128'"),
        ("desc_act", "no", "'no'"),
        ("sym", False, "False"),
        ("checkpoint_format", "gptq_v2", "'gptq_v2'"),
        ("format", "marlin", "'marlin'"),
        ("quant_method", "awq", "'awq'"),
        ("lm_head", True, "True"),
    ],
)
def test_the_config_refuses_other_gptq_variants(folders, tmp_path, field, value, shown):
    folder = config_with(folders["int4"], tmp_path, **{field: value})
    match = rf"^{tmp_path}/config.json: quantization_config.{field} is {shown}; supported: int4 GPTQ v1, symmetric"
    with pytest.raises(ModelError, match=match):
        read_gptq_config(folder)


def test_act_order_configs_are_refused_saying_why(folders, tmp_path):
    folder = config_with(folders["int4"], tmp_path, desc_act=True)
    message = rf"^{folder}/config.json: quantization_config.desc_act is True: act-order GPTQ checkpoints \(whose g_idx"
    with pytest.raises(ModelError, match=message + r".*; quantize with desc_act false$"):
        read_gptq_config(folder)


def test_the_config_reads_exclusions_and_refuses_other_bits_per_module(folders, tmp_path):
    dynamic = {"-:.*in_proj_[ab]": {}, r"+:.*mlp\..*": {"group_size": 32}}
    folder = config_with(folders["int4"], tmp_path, dynamic=dynamic, modules_to_not_convert=["lm_head"])
    assert read_gptq_config(folder) == GptqConfig(bits=4, group_size=32, excluded=("lm_head", ".*in_proj_[ab]"))
    config_with(folders["int4"], tmp_path, dynamic={r".*down_proj": {"bits": 8}})
    with pytest.raises(ModelError, match=r"dynamic\['\.\*down_proj'\] sets bits 8; supported: int4 GPTQ v1"):
        read_gptq_config(folder)


def test_zero_points_other_than_7_are_refused(int4_raw):
    name = GROUPS["attention out"][0]
    raw = dict(int4_raw)
    raw[f"{name}.qzeros"] = raw[f"{name}.qzeros"].clone()
    raw[f"{name}.qzeros"][1, 2] = 0x77787777  # output 2 * 8 + 4 of group 1 stores 8
    message = rf"^{name}.qzeros: stored zero-points \[7, 7, 7, 7, 8, 7, 7, 7\] at group 1, outputs 16..23; a sym"
    with pytest.raises(ModelError, match=message):
        int4_linears(raw, "bf16")([name])


def test_act_order_is_refused(int4_raw):
    name = GROUPS["down"][0]
    raw = dict(int4_raw)
    raw[f"{name}.g_idx"] = raw[f"{name}.g_idx"].flip(0)
    with pytest.raises(ModelError, match=rf"^{name}.g_idx: not i // 32 \(act-order or another group size"):
        int4_linears(raw, "bf16")([name])
    raw[f"{name}.g_idx"] = torch.zeros(128, dtype=torch.int64)
    with pytest.raises(ModelError, match=rf"^{name}.g_idx: torch.int64 \(128,\), expected torch.int32 \(128,\)"):
        int4_linears(raw, "bf16")([name])


def test_modes_outside_the_four_and_i8_without_a_table_are_refused(int4_raw):
    assert [scheme(mode) for mode in MODES] == ["int4-i8", "int4-f16", "int4-fp8", "int4-bf16"]
    with pytest.raises(ModelError, match=r"^an int4 checkpoint runs the quant modes i8, f16, fp8, bf16, not 'w8a8'"):
        scheme("w8a8")
    with pytest.raises(ModelError, match=r"^an int4 checkpoint runs the quant modes i8, f16, fp8, bf16, not 'fp8s'"):
        int4_linears(int4_raw, "fp8s")
    with pytest.raises(ModelError, match=r"^the int4 i8 mode needs the checkpoint's outlier table \(spinf_outliers"):
        int4_linears(int4_raw, "i8")
    with pytest.raises(ModelError, match=rf"^the outlier table \(spinf_outliers.json\) has no entry for {LAYER}2.mlp"):
        int4_linears(int4_raw, "i8", {})(GROUPS["gate/up"])


def edit_table(folders, tmp_path, edit):
    folder = tmp_path / "edited"
    shutil.copytree(folders["int4"], folder)
    table = json.loads((folder / OUTLIERS_FILE).read_text())
    edit(table)
    (folder / OUTLIERS_FILE).write_text(json.dumps(table))
    return folder


def test_the_outlier_table_is_read_and_checked(folders, tmp_path):
    table = read_outliers(folders["int4"])
    assert len(table) == 12 and all(len(c) == CHANNELS and list(c) == sorted(c) for c in table.values())
    assert read_outliers(folders["float"]) is None
    first = GROUPS["gdn in"][0]
    cases = [
        (lambda t: t.update(format_version=2), r"format_version 2, expected 1"),
        (lambda t: t.update(channels=0), r"channels 0 is not a positive integer"),
        (lambda t: t.update(extra=1), r"unknown key 'extra'"),
        (lambda t: t["linears"].pop(first), rf"no entry for {first} \(one entry per norm-fed linear: 12\)"),
        (lambda t: t["linears"].update({GROUPS["down"][0]: [0] * 8}), r"an entry for .*down_proj, which is no norm"),
        (
            lambda t: t["linears"][first].__setitem__(1, t["linears"][first][0]),
            rf"linears\[{first!r}\] repeats channel \d+$",
        ),
        (lambda t: t["linears"][first].pop(), rf"linears\[{first!r}\] has 7 channels, not channels 8$"),
        (lambda t: t["linears"][first].clear(), rf"linears\[{first!r}\] is not a non-empty list of integers$"),
        (lambda t: t["linears"].update({first: [0.5] * 8}), r"linears\[.*\] is not a non-empty list of integers$"),
        (lambda t: t.pop("format_version"), r"neither outlier-table format: no 'format_version' \(ours\) nor .*"),
        (
            lambda t: t["linears"][first].__setitem__(0, 64),
            rf"linears\[{first!r}\] has a channel outside the input width 64",
        ),
    ]
    for index, (edit, message) in enumerate(cases):
        folder = edit_table(folders, tmp_path / str(index), edit)
        with pytest.raises(ModelError, match=rf"^{folder}/{OUTLIERS_FILE}: {message}"):
            read_outliers(folder)


def test_the_outliers_are_the_channels_with_the_largest_inputs(folders, tmp_path):
    calibration = tokens(5, 200)
    folder = write_gptq_checkpoint(
        folders["float"], tmp_path / "q", outlier_channels=CHANNELS, calibration_tokens=calibration
    )
    table = read_outliers(folder)
    # layer 0's GDN input is the normed embedding: computed here without the model
    raw = read_tensors(folders["float"], "")
    h = raw[TEXT_PREFIX + "embed_tokens.weight"][torch.tensor(calibration)]
    x = rms_norm(h, raw[f"{LAYER}0.input_layernorm.weight"], 1e-6)
    peaks = x.abs().amax(0)
    expected = sorted(peaks.argsort(descending=True, stable=True)[:CHANNELS].tolist())
    assert list(table[GROUPS["gdn in"][0]]) == expected


@pytest.mark.parametrize("mode", MODES)
def test_the_int4_path_gives_the_float_paths_bits_on_the_dequantized_weights(folders, mode):
    """The dequantized weight is exact in fp32, so the same mode on an int4 checkpoint and on a float checkpoint of
    its dequantized weights must agree bit for bit: this isolates unpacking and fusion from the modes' rounding."""
    layout = build_pass([job(10), job(20)])
    got = model_of(folders["int4"], mode).pass_logprobs(layout)
    expected = model_of(folders["dequantized"], mode).pass_logprobs(layout)
    assert torch.equal(got, expected)


def test_every_mode_scores_close_to_the_float_model_of_the_dequantized_weights(folders):
    layout = build_pass([job(10), job(20)])
    reference = load_qwen35(folders["dequantized"]).pass_logprobs(layout)
    means = {}
    for mode in MODES:
        error = (model_of(folders["int4"], mode).pass_logprobs(layout) - reference).abs()
        means[mode] = error.mean().item()
        assert error.max().item() <= TOLERANCE[mode][0] and means[mode] <= TOLERANCE[mode][1], mode
    # the modes' precisions in order: fp16 (11 significant bits), bf16 (8), int8 per token, e4m3 (4)
    assert means["f16"] < means["bf16"] < means["i8"] < means["fp8"]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("group", list(GROUPS))
def test_every_mode_is_row_invariant(int4_raw, folders, mode, group):
    linear = int4_linears(int4_raw, mode, read_outliers(folders["int4"]))(GROUPS[group])
    width = linear.weight().shape[1]
    x = torch.randn(200, width, generator=torch.Generator().manual_seed(7))
    x[:, 3] *= 30  # an outlier channel
    alone = torch.cat([linear(x[r : r + 1]) for r in (0, 5, 37, 150)])
    among = linear(x[:38])
    assert torch.equal(alone[:3], among[[0, 5, 37]])
    assert torch.equal(alone, linear(x)[[0, 5, 37, 150]])
    assert torch.equal(alone[1:3], linear(x[[37, 5]].flip(0)))


@pytest.mark.parametrize("mode", MODES)
def test_a_prompt_scores_the_same_bits_alone_and_packed(folders, mode):
    model = model_of(folders["int4"], mode)
    alone = model.pass_logprobs(build_pass([job(30)]))
    packed = model.pass_logprobs(build_pass([job(40), job(30), job(50)]))
    assert torch.equal(alone, packed[3:6])


def integer_linear(split: bool, width: int) -> tuple[Int4Linear, torch.Tensor, torch.Tensor]:
    """An i8 linear whose int8 weight and activation scales are exactly 1: integer weights and inputs with 127 in
    every row and every 128-channel block, so the result must equal the exact product."""
    gen = torch.Generator().manual_seed(8)
    weight = torch.randint(-127, 128, (16, width), generator=gen).float()
    weight[:, 1] = 127
    x = torch.randint(-127, 128, (5, width), generator=gen).float()
    x[:, 0::ACT_BLOCK] = 127
    return Int4Linear([weight], "i8", [width - 1] if split else None), x, weight


@pytest.mark.parametrize("split", [False, True], ids=["block-scaled", "split"])
def test_the_int8_products_are_exact(split):
    width = 300  # blocks of 128, 128 and 44
    linear, x, weight = integer_linear(split, width)
    if split:  # the outlier channel is not quantized: fp16 holds these integers exactly
        x[:, width - 1] = 1000.0
    exact = (x.double() @ weight.double().t()).float()
    assert torch.equal(linear(x), exact)


def test_the_split_scheme_keeps_the_outlier_channels_out_of_the_int8_scale(int4_raw):
    names = GROUPS["gate/up"]
    x = torch.randn(8, 64, generator=torch.Generator().manual_seed(9))
    x[:, 11] = 400.0  # one channel far above the rest, as in a real model
    split = int4_linears(int4_raw, "i8", {names[0]: [11, 12, 13, 14]})(names)
    elsewhere = int4_linears(int4_raw, "i8", {names[0]: [20, 21, 22, 23]})(names)
    reference = x @ split.weight().t()
    assert (split(x) - reference).abs().max() * 10 < (elsewhere(x) - reference).abs().max()
