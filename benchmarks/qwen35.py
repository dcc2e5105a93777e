"""Issue 17's measurement: Qwen3.8-27B int4 on one GPU, with random int4 weights in the real shapes.

    python benchmarks/qwen35.py --root /dev/shm/qwen [--jobs J1,J2,J3] [--invariance] [--cap-gib 24]
        [--no-j2-invariance] [--extraction 16] [--baseline [--batch 64]] [--group N | --groups 32,128]
        [--breakdown] [--trace DIR] [--repeats 3] [--results [FILE]]
    python benchmarks/qwen35.py --shape tiny --device cpu --jobs J3 --max-inputs 2   # the CPU smoke run

1. A checkpoint in the published layout (`write_random_int4`): ``config.json`` (``qwen3_5`` with the text config
   under ``text_config`` and a GPTQ ``quantization_config``, also in ``quantize_config.json`` as gptqmodel writes
   it), sharded safetensors with an index, the decoder linears as GPTQ v1 int4 (random codes, fp16 group scales
   drawn so that each output is near unit scale, every zero-point 7, ``g_idx`` = ``i // G``), the GDN's b/a rows,
   norms, conv, embedding and LM head in bf16, a random outlier table (``spinf_outliers.json``) and the tiny
   tokenizer. G is ``--group`` (32, the published checkpoints' group, unless said; -1: one group per row, as
   ``group_size`` -1 means): the config's ``group_size``, the scales' and zero-points' rows (in / G) and ``g_idx``
   follow it. On a GPU it is written under a Hub cache root at the catalog's pinned revision (``--root``'s for
   group 32, a subfolder of it for another group) and served by its catalog name, ``spinf/qwen3.8-27b-int4``, as
   ``spinf-serve serve`` would (``HF_HUB_OFFLINE``: nothing is downloaded); on the CPU (the tiny shape) it is
   served by its path. ``--groups 32,128``: everything below for each group in turn (one engine at a time), then
   the groups side by side: questions/s, MFU and peak memory per job set.
2. The int8 GEMM rate of this GPU at 16384 × 5120 × 17408, the faster of ``torch._int_mm`` and the engine's own
   i8 product (which outran cuBLASLt's on the H100: RESULTS.md): the MFU denominator of int4-i8.
3. Each job set through `Engine.score`: questions/s, tokens run, passes, peak GPU memory, MFU = tokens × 2 × linear
   parameters / time / int8 rate.
4. ``--invariance``: per-question invariance over the compositions of `benchmarks.invariance` (alone, with its
   input's other questions, as concurrent calls, shuffled, floor cache off, beside J2): differing bits.
5. ``--extraction N``: the extraction and generation slot calls of benchmarks/extraction.py on ``N`` inputs (a
   base call of 20 scored questions per input, then +1 or +8 searched or generated slots per input, as served and
   at full length): milliseconds per slot and slots/s.
6. ``--baseline``: the same job sets on transformers' ``Qwen3_5ForCausalLM`` with a prefix cache
   (`benchmarks.baseline`: each content once, its questions in batches of ``--batch`` rows over a copy of the cache,
   the linear-attention layers' conv and recurrent states copied per row), holding the same folder's weights with
   the int4 linears dequantized (`transformers_qwen35`), bf16 on a GPU: rows, ours / baseline, and the largest
   log-prob difference (ours in its int4 mode). Run after ours has given its memory back.
7. ``--cap-gib``: the engine again under that cap (``torch.cuda.set_per_process_memory_fraction``), J1 and J2: does
   it fit a 24 GB card, and at what peak.
8. ``--breakdown``: one more call of each job set's first body under torch.profiler, its time by kind of GPU work
   (benchmarks/breakdown.py's categories: the int4 products, the token-by-token recurrence, fla's chunked kernels,
   attention, norms, torch's elementwise ops, the LM head, host gaps), each as time and share.
9. ``--http N``: once the in-process engine is gone, a real ``spinf-serve serve spinf/qwen3.8-27b-int4`` process on
   the same cache (``SPINF_CACHE_DIRS``, offline), as a user starts it: the seconds to ``/readyz``; J3's first body
   ``N`` times one after another on one connection (after 20 warm calls): p50 / p99 and the answers' own timing;
   J1's first body as one call per input, all at once; each compared bit for bit with the in-process answers.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import sys
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
from safetensors.torch import save_file

from benchmarks.gpu_jobsets import engine_call, job_bodies, measure, note_row, parse_body, row
from benchmarks.results import RESULTS, append_section, cpu_machine
from spinf.engine import hostgc
from spinf.engine.compiler import compile_request
from spinf.engine.engine import Engine
from spinf.engine.layout import build_pass
from spinf.engine.qwen35.chunked import CHUNKED_MIN, fixed_spans
from spinf.engine.qwen35.gptq import GROUP, STORED_ZEROS, WHOLE_ROW
from spinf.engine.qwen35.int4_write import QUANTIZATION_CONFIG, quantized_names
from spinf.engine.qwen35.outliers import OUTLIERS_FILE, OUTLIERS_VERSION, norm_fed_names
from spinf.engine.qwen35.tiny import TINY_TEXT_CONFIG
from spinf.engine.tiny_tokenizer import tokenizer_files
from spinf.errors import SpinfError

MODEL = "spinf/qwen3.8-27b-int4"
REVISION = "22de4859c04ccdb4136d89b66e56e717db752c7c"  # the manifest's pin (spinf/catalog/manifests)
PREFIX = "model.language_model."
# engine spec B.14.1: 64 layers (a full-attention layer every 4th), hidden 5120, 24 query heads with an output gate,
# 4 KV heads of 256, rope on 64 dims in sections [11, 11, 10]; GDN 48 value heads of 128 (16 key heads of 128)
SHAPE_27B = {
    **TINY_TEXT_CONFIG,
    "vocab_size": 248_320,
    "hidden_size": 5120,
    "intermediate_size": 17_408,
    "num_hidden_layers": 64,
    "layer_types": ["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(64)],
    "num_attention_heads": 24,
    "num_key_value_heads": 4,
    "head_dim": 256,
    "linear_num_key_heads": 16,
    "linear_num_value_heads": 48,
    "linear_key_head_dim": 128,
    "linear_value_head_dim": 128,
    "rope_parameters": {
        "rope_type": "default",
        "rope_theta": 10_000_000.0,
        "partial_rotary_factor": 0.25,
        "mrope_section": [11, 11, 10],
        "mrope_interleaved": True,
    },
}
SHAPES = {"27b": SHAPE_27B, "tiny": TINY_TEXT_CONFIG}
SHARD_BYTES = 4 * 2**30


def linear_shapes(text: dict) -> dict[str, tuple[int, int]]:
    """Every decoder linear's [out, in] by full name (without ``.weight``)."""
    hidden, inner = text["hidden_size"], text["intermediate_size"]
    d, heads, kv = text["head_dim"], text["num_attention_heads"], text["num_key_value_heads"]
    key_dim = text["linear_num_key_heads"] * text["linear_key_head_dim"]
    value_heads = text["linear_num_value_heads"]
    value_dim = value_heads * text["linear_value_head_dim"]
    out = {}
    for i, kind in enumerate(text["layer_types"]):
        at = f"{PREFIX}layers.{i}."
        if kind == "full_attention":
            out |= {
                at + "self_attn.q_proj": (2 * heads * d, hidden),
                at + "self_attn.k_proj": (kv * d, hidden),
                at + "self_attn.v_proj": (kv * d, hidden),
                at + "self_attn.o_proj": (hidden, heads * d),
            }
        else:
            out |= {
                at + "linear_attn.in_proj_qkv": (2 * key_dim + value_dim, hidden),
                at + "linear_attn.in_proj_z": (value_dim, hidden),
                at + "linear_attn.in_proj_b": (value_heads, hidden),
                at + "linear_attn.in_proj_a": (value_heads, hidden),
                at + "linear_attn.out_proj": (hidden, value_dim),
            }
        out |= {
            at + "mlp.gate_proj": (inner, hidden),
            at + "mlp.up_proj": (inner, hidden),
            at + "mlp.down_proj": (hidden, inner),
        }
    return out


def other_shapes(text: dict) -> dict[str, tuple[int, ...]]:
    """The float tensors beside the linears: embedding, LM head, norms, and the GDN's conv, decay and gated norm."""
    hidden, vocab = text["hidden_size"], text["vocab_size"]
    conv = 2 * text["linear_num_key_heads"] * text["linear_key_head_dim"]
    conv += text["linear_num_value_heads"] * text["linear_value_head_dim"]
    out = {PREFIX + "embed_tokens.weight": (vocab, hidden), PREFIX + "norm.weight": (hidden,)}
    out["lm_head.weight"] = (vocab, hidden)
    for i, kind in enumerate(text["layer_types"]):
        at = f"{PREFIX}layers.{i}."
        out |= {at + "input_layernorm.weight": (hidden,), at + "post_attention_layernorm.weight": (hidden,)}
        if kind == "full_attention":
            out |= {
                at + "self_attn.q_norm.weight": (text["head_dim"],),
                at + "self_attn.k_norm.weight": (text["head_dim"],),
            }
        else:
            heads = text["linear_num_value_heads"]
            out |= {
                at + "linear_attn.conv1d.weight": (conv, 1, text["linear_conv_kernel_dim"]),
                at + "linear_attn.dt_bias": (heads,),
                at + "linear_attn.A_log": (heads,),
                at + "linear_attn.norm.weight": (text["linear_value_head_dim"],),
            }
    return out


def group_inputs(text: dict, group: int) -> dict[str, int]:
    """The inputs per scale group of each quantized linear (``group``; `WHOLE_ROW`: its whole input width), or
    `ValueError` where ``group`` does not divide a linear's inputs into even groups."""
    quantized = set(quantized_names(text["layer_types"], PREFIX))
    out = {}
    for name, (_, width) in linear_shapes(text).items():
        if name in quantized:
            out[name] = width if group == WHOLE_ROW else group
            if out[name] <= 0 or width % out[name] or out[name] % 2:
                raise ValueError(f"group size {group} does not divide {name}'s {width} inputs into even groups")
    return out


def random_tensors(text: dict, device: torch.device, seed: int, group: int = GROUP):
    """(name, tensor) on the CPU, one at a time: int4 GPTQ v1 tensors for the quantized linears, in scale groups of
    ``group`` inputs (`WHOLE_ROW`: one per output row), bf16 for the rest. Drawn on ``device`` (a GPU draws 13 GB
    in seconds)."""
    generator = torch.Generator(device=device).manual_seed(seed)
    groups = group_inputs(text, group)
    for name, (out, width) in linear_shapes(text).items():
        if name not in groups:  # the GDN's b/a rows stay float (B.14.3)
            yield name + ".weight", (torch.randn((out, width), generator=generator, device=device) / math.sqrt(width))
            continue
        size = groups[name]
        words = torch.randint(-(2**31), 2**31 - 1, (width // 8, out), generator=generator, device=device)
        yield name + ".qweight", words.to(torch.int32)
        yield name + ".qzeros", torch.full((width // size, out // 8), STORED_ZEROS, dtype=torch.int64).to(torch.int32)
        # codes - 8 have a standard deviation of about 4.6: scales of 1 / (4.6 · sqrt(in)) keep outputs near unit scale
        scale = 1.0 / (4.6 * math.sqrt(width))
        scales = scale * (0.5 + torch.rand((width // size, out), generator=generator, device=device))
        yield name + ".scales", scales.to(torch.float16)
        yield name + ".g_idx", (torch.arange(width, dtype=torch.int32) // size)
    for name, shape in other_shapes(text).items():
        value = torch.randn(shape, generator=generator, device=device)
        if name.endswith("A_log"):
            value = torch.log(0.02 + 0.28 * torch.rand(shape, generator=generator, device=device))
        elif name.endswith("linear_attn.norm.weight"):
            value = 1.0 + 0.1 * value
        elif name.endswith("norm.weight"):
            value = 0.1 * value
        elif name.endswith("dt_bias"):
            value = 0.5 * value - 1.0
        elif name.endswith("conv1d.weight"):
            value = 0.5 * value
        elif not name.endswith("embed_tokens.weight"):
            value = value / math.sqrt(shape[-1])
        yield name, value.to(torch.bfloat16)


def write_random_int4(folder: Path, text: dict, device: torch.device, seed: int = 0, group: int = GROUP) -> Path:
    """The checkpoint of `random_tensors` in the published layout (see the module docstring), in scale groups of
    ``group`` inputs: the config's ``quantization_config.group_size`` and a ``quantize_config.json`` say so, as
    gptqmodel writes them. A folder with a ``.complete`` file is taken as written."""
    if (folder / ".complete").is_file():
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    quantization = QUANTIZATION_CONFIG | {"group_size": group}
    config = {
        "model_type": "qwen3_5",
        "architectures": ["Qwen3_5ForConditionalGeneration"],
        "text_config": {**text, "dtype": "bfloat16"},
        "tie_word_embeddings": False,
        "dtype": "bfloat16",
        "quantization_config": quantization,
    }
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    (folder / "quantize_config.json").write_text(json.dumps(quantization, indent=2) + "\n")
    for name, data in tokenizer_files().items():
        (folder / name).write_bytes(data)
    shard, size, index, number = {}, 0, {}, 1
    for name, tensor in random_tensors(text, device, seed, group):
        shard[name] = tensor.cpu().contiguous()
        size += tensor.numel() * tensor.element_size()
        if size >= SHARD_BYTES:
            index |= _save(folder, shard, number)
            shard, size, number = {}, 0, number + 1
    if shard:
        index |= _save(folder, shard, number)
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": index}, indent=1))
    generator = torch.Generator().manual_seed(seed + 1)
    channels = min(64, text["hidden_size"] // 8)
    linears = {
        name: sorted(torch.randperm(text["hidden_size"], generator=generator)[:channels].tolist())
        for name in norm_fed_names(text["layer_types"], PREFIX)
    }
    table = {"format_version": OUTLIERS_VERSION, "channels": channels, "linears": linears}
    (folder / OUTLIERS_FILE).write_text(json.dumps(table))
    (folder / ".complete").write_text("")
    return folder


def _save(folder: Path, shard: dict, number: int) -> dict[str, str]:
    name = f"model-{number:05d}.safetensors"
    save_file(shard, str(folder / name), metadata={"format": "pt"})
    return dict.fromkeys(shard, name)


def linear_parameters(text: dict) -> int:
    return sum(out * width for out, width in linear_shapes(text).values())


INT8_PEAK_SHAPE = (16384, 5120, 17408)  # m × k × n of the int8 rate


def int8_rates(device: torch.device) -> dict[str, float]:
    """The int8 GEMM rates (TOP/s) of this GPU at `INT8_PEAK_SHAPE`: ``torch._int_mm`` (cuBLASLt) and the engine's own
    i8 product (`spinf.engine.kernels.int4.int8_mm` at its tile for that many rows, one scale per row and per
    channel, bf16 out); empty on the CPU."""
    if device.type != "cuda":
        return {}
    from benchmarks.gpu_probe import timed
    from spinf.engine.kernels.int4 import int8_mm

    m, k, n = INT8_PEAK_SHAPE
    a = torch.randint(-127, 127, (m, k), device=device, dtype=torch.int8)
    w = torch.randint(-127, 127, (n, k), device=device, dtype=torch.int8)
    a_scale, w_scale = torch.ones((m, 1), device=device), torch.ones(n, device=device)
    operations = 2 * m * k * n
    cublas = timed(lambda: torch._int_mm(a, w.t()))
    ours = timed(lambda: int8_mm(a, a_scale, w, w_scale, torch.bfloat16, blocked=False))
    return {"torch._int_mm": operations / cublas / 1e12, "the engine's i8 product": operations / ours / 1e12}


def int8_peak_tops(device: torch.device) -> tuple[float | None, str]:
    """The MFU denominator of int4-i8: the faster of `int8_rates` (None on the CPU), and a phrase naming both."""
    rates = int8_rates(device)
    if not rates:
        return None, "no MFU on the CPU"
    m, k, n = INT8_PEAK_SHAPE
    both = ", ".join(f"{name} {rate:.0f}" for name, rate in rates.items())
    peak = max(rates.values())
    return peak, f"int8 GEMM rate {peak:.0f} TOP/s (the MFU denominator: the faster of {both} at {m} × {k} × {n})"


TEXT_PREFIX = "model.language_model."  # the checkpoint's text weights; transformers' text model calls them "model."


def transformers_qwen35(folder: Path, device: torch.device, dtype: torch.dtype):
    """transformers' ``Qwen3_5ForCausalLM`` holding the text weights of the checkpoint in ``folder`` (the folder our
    engine reads): float tensors as stored, GPTQ int4 linears dequantized (``s · (q − 8)``, exact in fp32), all in
    ``dtype`` on ``device``. Built on ``meta`` and assigned, so no random initialisation runs."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from benchmarks.baseline import assign_weights
    from spinf.engine.folder import read_tensors
    from spinf.engine.qwen35.gptq import unpack_gptq

    config = AutoConfig.from_pretrained(folder).get_text_config()
    if hasattr(config, "quantization_config"):  # the weights arrive dequantized: no quantizer
        del config.quantization_config
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    raw = read_tensors(folder, "")
    quantized = {name.removesuffix(".qweight") for name in raw if name.endswith(".qweight")}
    parts = ("qweight", "qzeros", "scales", "g_idx")
    state = {}
    for name, tensor in raw.items():
        base = name.rsplit(".", 1)[0]
        if not (name.startswith(TEXT_PREFIX) or name == "lm_head.weight") or base in quantized:
            continue  # the vision tower; an int4 linear's parts (below)
        state[name.replace(TEXT_PREFIX, "model.", 1)] = tensor.to(device=device, dtype=dtype)
    for base in quantized:
        fields = {f"{base}.{p}": raw[f"{base}.{p}"].to(device) for p in parts if f"{base}.{p}" in raw}
        weight = unpack_gptq(fields, base).dequantize().to(dtype)
        state[base.replace(TEXT_PREFIX, "model.", 1) + ".weight"] = weight
    tied = ("lm_head.weight",) if "lm_head.weight" not in state else ()
    return assign_weights(model, state, device, tied=tied)


def runner(engine: Engine) -> str:
    """The scheme, and for ``i8`` on a GPU whether the int8 weights were kept unpacked (`keep_unpacked`)."""
    from spinf.engine.qwen35.int4 import Int4Linear

    linears = [m for m in engine.model.modules() if isinstance(m, Int4Linear) and m.mode == "i8"]
    if not linears or linears[0].amax.device.type != "cuda":  # the CPU runs the torch code
        return engine.quant
    kept = all(m.int8 is not None for m in linears)
    graphs = "CUDA graphs" if engine.scorer.graphs is not None else "eager passes"
    return f"{engine.quant}, int8 weights {'kept unpacked' if kept else 'unpacked per call'}, {graphs}"


def baseline_lines(args, folder: Path, device: torch.device, jobs: dict, ours: dict, flops: float, emit) -> None:
    """The job sets on transformers (`benchmarks.baseline`: each content once into its cache, the questions in
    batches over it) with the folder's weights in bf16 on a GPU (fp32 on the CPU): rows (MFU against this GPU's
    bf16 rate), ours / baseline, and the largest log-prob difference (ours in its int4 mode, the baseline on the
    dequantized weights)."""
    import transformers

    from benchmarks.gpu_jobsets import baseline_call, bf16_peak_tflops, max_difference
    from spinf.engine.tokenizer import TextTokenizer

    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)  # the rows' peak: the baseline's own
    started = time.perf_counter()
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    bf16_peak = bf16_peak_tflops(device)
    model = transformers_qwen35(folder, device, dtype)
    tokenizer = TextTokenizer.from_folder(folder)
    name = f"transformers {transformers.__version__}, {str(dtype).removeprefix('torch.')}, prefix cache"
    emit(note_row("setup", f"baseline ({name}) loaded from the folder in {time.perf_counter() - started:.0f} s"))

    def call(body: dict):
        return baseline_call(model, tokenizer, args.batch, body)

    for job, bodies in jobs.items():
        call(bodies[0])  # warm
        m = measure(call, bodies, device, 1, (0.0, 300.0))
        emit(row(job, f"baseline, {name}, batch {args.batch}", m, flops, bf16_peak))
        if job in ours:
            ratio = m["seconds"] / ours[job]["seconds"]
            diff = max_difference(ours[job]["logprobs"], m["logprobs"])
            text = f"ours / baseline: {ratio:.2f}× the questions/s; max |Δ logprob| {diff:.3g}"
            emit(note_row(job, f"{text} (ours {ours[job]['runner']})"))


def chunked_text(engine: Engine, bodies: list[dict]) -> str:
    """How many of a job set's stream rows lie in fixed prefixes that run in fla's chunked kernels on a GPU (when
    fla-core is importable; the rest run token by token): the bodies compiled and laid out as the engine does, the
    spans read by the engine's own rule (`fixed_spans`), so the total equals the tokens the engine runs with a cold
    floor cache (a batch-invariant engine's warm cache runs fewer: no floor rows)."""
    total = chunked = 0
    for body in bodies:
        layout = build_pass(compile_request(parse_body(body), engine.tokenizer, engine.shape).jobs)
        total += layout.num_tokens
        chunked += sum(end - first for first, end in fixed_spans(layout))
    return (
        f"rows in fixed prefixes of at least {CHUNKED_MIN} (chunked on a GPU with fla-core; the floors laid out too, "
        f"which a warm floor cache does not run): {chunked:,} of "
        f"{total:,} ({chunked / max(total, 1):.1%})"
    )


def trace_lines(engine: Engine, job: str, body: dict, folder: Path) -> None:
    """One call of ``body`` traced twice (benchmarks/trace.py): without Python frames, for the idle gaps as they
    are, and with them, for the frames (which the profiler's hooks slow down)."""
    from benchmarks.trace import idle_lines, trace_call

    folder.mkdir(parents=True, exist_ok=True)
    for stack in (False, True):
        path = folder / f"{job.lower()}{'-stack' if stack else ''}.json"
        seconds = trace_call(lambda: engine_call(engine, body), path, stack=stack)
        print(f"{job} traced{' with Python frames' if stack else ''}: {seconds:.3f} s, {path}", flush=True)
        print(*idle_lines(path), sep="\n", flush=True)


def breakdown_lines(engine: Engine, job: str, body: dict, flops: float, peak: float | None) -> list[str]:
    """Where one warm call of ``body`` spends its time, by kind of GPU work (benchmarks/breakdown.py's categories,
    fla's chunked kernels and the int4 products among them), from one profiler run: its header line and table."""
    import tempfile

    from benchmarks.breakdown import categorise, profiled_call, table

    found = []
    with tempfile.TemporaryDirectory(prefix="spinf-qwen-breakdown-") as temporary:
        trace = Path(temporary) / f"{job}.json"
        wall_us, read_rows = profiled_call(lambda: found.append(engine_call(engine, body)), engine.model,
                                           engine.device, trace)  # fmt: skip
        rows = categorise(json.loads(trace.read_text())["traceEvents"], wall_us)
    call = found[0]
    mfu = f", MFU {call.tokens * flops / (wall_us / 1e6) / (peak * 1e12):.1%}" if peak else ""
    head = (
        f"**{job}** where the time goes (its first body, one call under torch.profiler): {call.questions:,} "
        f"questions, {call.tokens:,} tokens run in {call.passes} passes, {wall_us / 1e3:,.1f} ms{mfu}; the LM head "
        f"read {read_rows:,} rows; shares of the profiled call"
    )
    return ["", head, "", *table(rows, wall_us, call.passes)]


def open_engine(args: argparse.Namespace, folder: Path, token_budget: int | None = None) -> Engine:
    """The engine on ``folder``: by its path on the CPU; on a GPU as the catalog model, from the Hub cache the
    snapshot ``folder`` lies in (`snapshot_folder`)."""
    if args.device == "cpu":
        return Engine(str(folder), device="cpu", quant=args.quant, token_budget=token_budget)
    cache = [str(folder.parents[2])]
    return Engine(
        MODEL, device=args.device, quant=args.quant, cache_dirs=cache, token_budget=token_budget,
        compile=not args.no_compile,
    )  # fmt: skip


def snapshot_folder(root: Path, group: int) -> Path:
    """The catalog model's snapshot at its pinned revision, under a Hub cache in ``root`` for the published group
    (a folder written by an earlier run is found there) and in a subfolder of ``root`` for each other group: the
    catalog pins one revision, so each group needs a cache of its own."""
    if group != GROUP:
        root = root / ("whole-row" if group == WHOLE_ROW else f"group-{group}")
    return root / "hub" / ("models--" + MODEL.replace("/", "--")) / "snapshots" / REVISION


def group_name(group: int) -> str:
    return "whole-row groups" if group == WHOLE_ROW else f"group {group}"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=Path("/dev/shm/qwen35-bench"))
    parser.add_argument("--shape", choices=sorted(SHAPES), default="27b")
    parser.add_argument("--device", default="cuda:0")
    parser.add_argument("--quant", default="", help="an int4 mode (default: the automatic i8)")
    parser.add_argument("--jobs", default="J1,J2,J3")
    parser.add_argument("--max-inputs", type=int, default=None, help="cut each job set to this many inputs")
    parser.add_argument("--invariance", action="store_true")
    parser.add_argument("--cap-gib", type=float, default=None)
    parser.add_argument("--cap-jobs", default="J1,J2", help="the job sets measured under --cap-gib")
    parser.add_argument("--cap-token-budget", type=int, default=None, help="the engine's token budget under the cap")
    parser.add_argument("--no-j2-invariance", action="store_true", help="leave J2 out of the invariance check")
    parser.add_argument(
        "--extraction", type=int, default=0, help="also time benchmarks/extraction.py's slot calls on this many inputs"
    )
    parser.add_argument(
        "--baseline", action="store_true", help="also run the job sets on transformers with a prefix cache"
    )
    parser.add_argument("--batch", type=int, default=64, help="the baseline's rows per forward")
    parser.add_argument(
        "--trace",
        type=Path,
        default=None,
        help="trace each job set's first call (benchmarks/trace.py) into this folder",
    )
    parser.add_argument(
        "--breakdown",
        action="store_true",
        help="profile one call of each job set: its time by kind of GPU work (benchmarks/breakdown.py's table)",
    )
    parser.add_argument(
        "--results", type=Path, nargs="?", const=RESULTS, default=None, help="append the figures (to RESULTS.md)"
    )
    parser.add_argument("--repeats", type=int, default=3, help="timed rounds per job set (the median is shown)")
    parser.add_argument("--http", type=int, default=0, help="J3 calls over HTTP to a real server process (item 9)")
    parser.add_argument(
        "--no-compile", action="store_true", help="the engine's compile setting off: every pass eager, no CUDA graph"
    )
    groups = parser.add_mutually_exclusive_group()
    groups.add_argument(
        "--group", type=int, default=GROUP, help=f"GPTQ inputs per scale group ({GROUP}; -1: one per row)"
    )
    groups.add_argument("--groups", default=None, help="several group sizes, one after another (e.g. 32,128)")
    args = parser.parse_args(argv)
    try:
        args.groups = [int(g) for g in args.groups.split(",")] if args.groups else [args.group]
        for group in args.groups:
            group_inputs(SHAPES[args.shape], group)
    except ValueError as exc:
        parser.error(f"--group/--groups: {exc}")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    device = torch.device(args.device)
    peak, rate_phrase = int8_peak_tops(device)
    flops = 2 * linear_parameters(SHAPES[args.shape])
    sections, summary = [], []
    for group in args.groups:
        head, lines, ours = run_group(args, group, device, peak)
        sections.append(head + "\n\n" + "\n".join(lines))
        summary += [(group, job, m) for job, m in ours.items()]
        release_memory(device)  # the group's engine went with run_group's frame; not beside the next group's
    if len(args.groups) > 1:
        sections.append("\n".join(group_table(summary, flops, peak)))
        print(sections[-1])
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else cpu_machine()
    command = " ".join(["python", "benchmarks/qwen35.py", *(sys.argv[1:] if argv is None else argv)])
    head = f"`{command}` on {gpu}: the {args.shape} shape, random int4 weights"
    head += f"; {rate_phrase}"
    print(head)
    if args.results is not None:
        groups = "" if args.groups == [GROUP] else f", GPTQ {', '.join(group_name(g) for g in args.groups)}"
        title = f"Qwen3.8-27B int4 ({args.shape} shape{groups})"
        append_section(title, head + "\n\n" + "\n\n".join(sections), args.results)


def group_table(summary: list[tuple[int, str, dict]], flops: float, peak: float | None) -> list[str]:
    """The groups side by side: per job set, each group's questions/s, MFU and peak memory, and its questions/s
    against the first group's."""
    first = {job: m for group, job, m in summary if group == summary[0][0]}
    lines = [
        "| job | GPTQ groups | questions/s | MFU | peak memory | questions/s vs the first |",
        "|---|---|---|---|---|---|",
    ]
    for group, job, m in sorted(summary, key=lambda item: item[1]):
        rate = m["questions"] / m["seconds"]
        mfu = f"{m['tokens'] * flops / m['seconds'] / (peak * 1e12):.1%}" if peak else "–"
        memory = f"{m['peak_gib']:.1f} GiB" if m["peak_gib"] is not None else "–"
        ratio = rate / (first[job]["questions"] / first[job]["seconds"]) if job in first else float("nan")
        lines.append(f"| {job} | {group_name(group)} | {rate:,.0f} | {mfu} | {memory} | {ratio:.3f}× |")
    return lines


def run_group(args: argparse.Namespace, group: int, device: torch.device, peak: float | None):
    """Everything the run measures, on the checkpoint of one group size: its head line, its lines, and each job
    set's measurement."""
    text = SHAPES[args.shape]
    started = time.perf_counter()
    where = device if device.type == "cuda" else torch.device("cpu")
    folder = write_random_int4(snapshot_folder(args.root, group), text, where, group=group)
    written_s = time.perf_counter() - started
    started = time.perf_counter()
    engine = open_engine(args, folder)
    load_s = time.perf_counter() - started
    flops = 2 * linear_parameters(text)
    lines: list[str] = []

    def emit(*new: str) -> None:  # printed as they come: a run cut short keeps what it measured
        lines.extend(new)
        print(*new, sep="\n", flush=True)

    head = f"GPTQ {group_name(group)}: written in {written_s:.0f} s, the engine loaded in {load_s:.0f} s"
    print(f"{head} ({engine.quant})", flush=True)
    emit(
        "| job | runner | questions | time | questions/s | tokens run | passes | peak memory | MFU |",
        "|---|---|---|---|---|---|---|---|---|",
    )
    label = "" if args.groups == [GROUP] else f", GPTQ {group_name(group)}"
    jobs, ours, breakdown = {}, {}, []
    for job in args.jobs.split(","):
        bodies, note = job_bodies(job, args.max_inputs)
        if bodies is None:
            emit(note_row(job, note))
            continue
        jobs[job] = bodies
        engine_call(engine, bodies[0])  # warm: Triton compiles here
        hostgc.settle()  # as the server does once warm: the collector no longer traverses the model and libraries
        m = measure(lambda body: engine_call(engine, body), bodies, device, args.repeats, (2.0, 120.0))
        ours[job] = {**m, "runner": runner(engine)}
        emit(row(job, f"ours, {runner(engine)}{label}", m, flops, peak))
        emit(note_row(job, chunked_text(engine, bodies)))
        if args.trace:
            trace_lines(engine, job, bodies[0], args.trace)
        if args.breakdown:
            breakdown.extend(breakdown_lines(engine, job, bodies[0], flops, peak))
    if args.invariance and "J1" in jobs:
        from benchmarks.invariance import invariance_lines

        j2 = None if args.no_j2_invariance else jobs.get("J2", [None])[0]
        for job, found in invariance_lines(engine, jobs["J1"][0], j2, 64):
            emit(note_row(job, found))
    if breakdown:  # after the job sets' table and its invariance rows, which the tables would otherwise split
        emit(*breakdown)
    if args.extraction:
        from benchmarks.extraction import cost_lines

        emit(
            "",
            f"Extraction and generation slots (`--extraction {args.extraction}`, benchmarks/extraction.py's calls):",
        )
        emit("")
        cost_lines(engine, device, args.extraction, 20, 3, emit)
    if args.baseline:  # ours first gives its memory back: the 27B in bf16 takes 54 GB
        engine = None
        release_memory(device)
        baseline_lines(args, folder, device, jobs, ours, flops, emit)
        gc.collect()  # the baseline's model went with its function
    if args.http:  # the server process loads its own engine
        engine = None
        release_memory(device)
        http_lines(args, folder, jobs, ours, emit)
    if args.cap_gib and device.type == "cuda":
        engine = None
        release_memory(device)
        cap_lines(args, folder, device, jobs, flops, peak, emit)
    return head, lines, ours


def release_memory(device: torch.device) -> None:
    """Give back what a dropped engine held: `hostgc.settle` froze it in the heap, and a frozen object's cycles are
    collected only once unfrozen."""
    gc.unfreeze()
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def http_lines(args, folder: Path, jobs: dict, ours: dict, emit) -> None:
    """Item 9: the same folder served by a real ``spinf-serve serve`` process; J3 one call after another, J1 as
    concurrent calls, both compared with the in-process answers."""
    from benchmarks.http_load import ServerProcess, concurrent, one_after_another, percentile
    from benchmarks.invariance import differing_bits, keyed, keyed_logprobs, merged, one_per_input

    root = Path(__file__).resolve().parents[1]
    path = os.pathsep.join(p for p in (str(root), os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": path}
    if args.device == "cpu":
        argv = [str(folder), "--device", "cpu"]
    else:
        argv = [MODEL, "--device", args.device]
        env["SPINF_CACHE_DIRS"] = str(folder.parents[2])
    if args.quant:
        argv += ["--quant", args.quant]
    log = args.root / "server.log"
    with ServerProcess([*argv, "--queue", "512"], env=env, log=log, cwd=root, python=sys.executable) as server:
        ready_s = server.start(900.0)
        emit(note_row("setup", f"`spinf-serve {' '.join(server.argv[3:])}` ready in {ready_s:.1f} s"))
        if "J3" in ours:
            body = jobs["J3"][0]
            one_after_another(server.port, body, 20)  # warm: templates compiled, floors cached
            seconds, answers = one_after_another(server.port, body, args.http)
            lat = sorted(seconds)
            timing = {
                key: percentile(sorted(a["timing"][key] for a in answers if isinstance(a, dict)), 0.5)
                for key in ("wall_ms", "gpu_busy_ms")
            }
            want = keyed_logprobs(body, ours["J3"]["logprobs"][0])
            compared, differ = differing_bits(want, keyed(body, answers[-1]["results"]))
            emit(
                note_row(
                    "J3",
                    f"over HTTP, {args.http} calls one after another on one connection: p50 "
                    f"{percentile(lat, 0.5) * 1000:.1f} ms, p99 {percentile(lat, 0.99) * 1000:.1f} ms; the answers' "
                    f"medians: wall {timing['wall_ms']} ms, GPU busy {timing['gpu_busy_ms']} ms; {compared} "
                    f"questions against the in-process call: {differ} differ in any bit",
                )
            )
        if "J1" in ours:
            body = jobs["J1"][0]
            calls = one_per_input(body)
            wall, answers = concurrent(server.port, calls)
            statuses = sorted({status for status, _, _ in answers})
            done = [(b, a) for b, (status, a, _) in zip(calls, answers, strict=True) if status == 200]
            got = merged([keyed(b, a["results"]) for b, a in done])
            compared, differ = differing_bits(keyed_logprobs(body, ours["J1"]["logprobs"][0]), got)
            questions = len(got)
            emit(
                note_row(
                    "J1",
                    f"over HTTP, {len(calls)} concurrent calls (one input each, the first round, cold templates): "
                    f"{wall:.3f} s, {questions / wall:,.0f} questions/s, statuses {statuses}; {compared} questions "
                    f"against the in-process call: {differ} differ in any bit",
                )
            )
        code = server.stop()
    emit(note_row("setup", f"the server exited with {code} after SIGTERM"))


def cap_lines(args, folder: Path, device: torch.device, jobs: dict, flops: float, peak: float | None, emit) -> None:
    """The engine again under ``--cap-gib`` (``set_per_process_memory_fraction``), on ``--cap-jobs``."""
    total = torch.cuda.get_device_properties(device).total_memory
    torch.cuda.set_per_process_memory_fraction(args.cap_gib * 2**30 / total, device)
    engine = open_engine(args, folder, args.cap_token_budget)
    budget = f", token budget {engine.shape.token_budget}"
    for job in args.cap_jobs.split(","):
        bodies = jobs.get(job) or job_bodies(job, args.max_inputs)[0]
        if not bodies:
            continue
        label = f"ours, {runner(engine)}, under a {args.cap_gib:g} GiB cap{budget}"
        try:
            m = measure(lambda body: engine_call(engine, body), bodies, device, 1, (0.0, 120.0))
        except (SpinfError, RuntimeError) as exc:  # out of memory: the engine's ApiError, or torch's
            emit(note_row(job, f"{label}: failed, {type(exc).__name__}: {exc}"))
            continue
        emit(row(job, label, m, flops, peak))
    torch.cuda.set_per_process_memory_fraction(1.0, device)  # the next group runs uncapped


if __name__ == "__main__":
    main()
