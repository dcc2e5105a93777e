"""Issue 36 item 1: where one warm call's time goes, by kind of GPU work, from one profiler run per job set.

Run on the GPU machine: ``python benchmarks/breakdown.py [--jobs J1,J2] [--trace-dir DIR] [--results]``.

The engine is gpu_fast's: the fp8 GEMM peak measured first (the MFU denominator), the 12B-shaped random checkpoint
folder (`benchmarks.checkpoint`), calibrated and opened in fp8s as the server opens it, warmed up with one small
call and one call of each job set (`benchmarks.gpu_fast.warm_up`). Per job set, its first body is called
``--repeats`` times without the profiler (the median: the call's time as served, and its MFU), then once under
torch.profiler (CPU and CUDA activity, ``record_shapes``), with the LM head (`Gemma4Text.option_logprobs`, its
product over the read rows, the soft-capped log-sum-exp and the picks) inside a ``record_function`` range and its
read rows counted. Each table has a time per pass beside the call's time (the call's time over its passes).

`categorise` reads the Chrome trace back (pure Python, so a CPU test feeds it made-up events): each kernel, copy
and memset is tied to the host events open when it was launched (the launch's ``correlation``, then the ``cpu_op``
and ``user_annotation`` spans around the launch on its thread) and falls into one category:

- the LM head, when launched inside the head's range (or one of its own kernels: the soft-capped log-sum-exp);
- a GEMM by its shape, out × in (``N×K``), when launched inside ``aten::_scaled_mm``, ``aten::mm`` and the like, with
  its rows M summed over the call and its achieved TFLOP/s; GEMM kernels that no recorded op launched (CUDA graph
  replays of small passes) have no shape and form one row;
- each Triton kernel of spinf/engine/kernels/ by its function's name (`KERNEL_CATEGORIES`);
- host-device copies and memsets; other torch kernels, by the op that launched them;
- host gaps: the call's wall time minus the union of the GPU's busy intervals (the device had nothing to run).

Each row: time (ms) and share of the profiled call's wall time. The profiler slows the host a little, so the
unprofiled call time is shown beside it. ``--device cpu --scaled``: the CPU smoke run (no CUDA kernels, so the
whole call is host time).
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import json
import platform
import statistics
import sys
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path

import attrs

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.trace import GPU_CATEGORIES, merged  # noqa: E402

HEAD_RANGE = "spinf.breakdown.lm_head"  # the record_function range around the LM head
LAUNCH_CATEGORIES = ("cuda_runtime", "cuda_driver")
HOST_CATEGORIES = ("cpu_op", "user_annotation")
GEMM_OPS = ("aten::mm", "aten::addmm", "aten::_scaled_mm", "aten::_int_mm", "aten::bmm", "aten::baddbmm")
GEMM_KERNEL_WORDS = ("gemm", "nvjet", "cutlass", "xmma", "splitk", "cublas")  # cuBLAS(Lt) and CUTLASS kernel names

HEAD = "LM head over the read rows"
ATTENTION = "attention (tree attention, its output quantized)"
NORM_QUANT = "norm + quantization (with the residual add where fused)"
ROTARY = "q/k norm + rotary"
GLU = "GELU·up + quantization"
SILU = "SiLU·up (the Qwen3.5 MLP)"
GLU_GEMM = "gate/up GEMM + GELU·up + quantization (one kernel of ours, fp8)"
INT4 = "int4 → int8 GEMM (Triton, shape not recorded)"
RECURRENCE = "linear attention (GDN recurrence)"
CHUNKED = "linear attention, fixed prefixes chunked (fla's kernels)"
GDN_INPUTS = "recurrence inputs (convolution + SiLU, q/k L2 norms, gates)"
GATES = "output gates (the GDN's gated norm, attention's sigmoid gate)"
EXPERTS = "expert GEMMs (grouped, Triton, shape not recorded)"
GEMM_UNKNOWN = "GEMM, shape not recorded (CUDA graph replays)"
COPIES = "copies and memsets"
TORCH = "residual / elementwise (torch ops)"
OTHER = "other kernels"
HOST = "host gaps (GPU idle)"

# Every Triton kernel of spinf/engine/kernels/ by its function's name (tests/benchmarks/test_breakdown.py checks
# that none is missing).
KERNEL_CATEGORIES = {
    "_tree_attention_kernel": ATTENTION,
    "_norm_kernel": NORM_QUANT,
    "_add_norm_kernel": NORM_QUANT,  # residual add + norm + the next linear's quantizer, one kernel
    "_quantize_kernel": NORM_QUANT,
    "_dynamic_quantize_kernel": NORM_QUANT,
    "_qwen_norm_kernel": NORM_QUANT,
    "_quantize_blocks_kernel": NORM_QUANT,
    "_split_kernel": NORM_QUANT,  # the split quantizer, with Qwen's norm before it or not
    "_qkv_kernel": ROTARY,
    "_qk_rope_kernel": ROTARY,
    "_gelu_mul_kernel": GLU,
    "_fp8_gemm_kernel": GLU_GEMM,
    "_softcap_lse_kernel": HEAD,
    "_masked_lse_kernel": HEAD,
    "_int8_kernel": INT4,
    "_int8_tma_kernel": INT4,
    "_unpack_kernel": INT4,
    "_recurrent_kernel": RECURRENCE,
    "_decode_kernel": RECURRENCE,
    "_conv_silu_kernel": GDN_INPUTS,
    "_qk_kernel": GDN_INPUTS,
    "_gates_kernel": GDN_INPUTS,
    "_silu_mul_kernel": SILU,
    "_gated_norm_kernel": GATES,
    "_sigmoid_mul_kernel": GATES,
    "_grouped_kernel": EXPERTS,
    "_combine_kernel": EXPERTS,
}


# flash-linear-attention's kernels, which the Qwen3.5 stack runs for each fixed prefix (spinf.engine.kernels.chunked),
# by their names' beginnings
FLA_KERNELS = ("chunk_", "recompute_w_u")


@attrs.frozen
class Row:
    category: str
    us: float
    detail: str = ""
    flops: float = 0.0  # GEMM rows: 2·M·N·K summed over their launches


def _end(event: dict) -> float:
    return event["ts"] + event.get("dur", 0)


def _cat(event: dict) -> str:
    return str(event.get("cat", "")).lower()


def launch_contexts(spans: list[dict]) -> dict:
    """The host spans open around each launch on its thread, outermost first, by the launch's ``correlation``; and
    around each op, itself included, by ``("op", External id)``, for a kernel whose launch was not recorded (one
    sweep over properly nested spans)."""
    host, points = defaultdict(list), defaultdict(list)
    for e in spans:
        args = e.get("args", {})
        if _cat(e) in HOST_CATEGORIES:
            host[e.get("tid")].append(e)
            if _cat(e) == "cpu_op" and "External id" in args:
                points[e.get("tid")].append((e["ts"], ("op", args["External id"])))
        elif _cat(e) in LAUNCH_CATEGORIES and "correlation" in args:
            points[e.get("tid")].append((e["ts"], args["correlation"]))
    contexts = {}
    for tid, found in points.items():
        opened = sorted(host.get(tid, []), key=lambda e: (e["ts"], -e.get("dur", 0)))
        stack: list[dict] = []
        i = 0
        for at, key in sorted(found, key=lambda point: point[0]):
            while i < len(opened) and opened[i]["ts"] <= at:
                while stack and _end(stack[-1]) < opened[i]["ts"]:
                    stack.pop()
                stack.append(opened[i])
                i += 1
            while stack and _end(stack[-1]) < at:
                stack.pop()
            contexts[key] = tuple(stack)
    return contexts


def gemm_shape(dims: list) -> tuple[int, int, int] | None:
    """(M, N, K) from a GEMM op's recorded input dims: the first two 2-D operands [M, K] and [K, N] (``addmm``'s
    bias before them is skipped)."""
    shapes = [d for d in dims if isinstance(d, list) and len(d) == 2]
    for a, b in zip(shapes, shapes[1:], strict=False):
        if a[1] == b[0]:
            return a[0], b[1], a[1]
    return None


def _triton_category(name: str) -> str | None:
    base = name.split("(")[0].strip()
    return next((c for k, c in KERNEL_CATEGORIES.items() if base == k or base.startswith(k + "_")), None)


def classify(event: dict, context: tuple[dict, ...]) -> tuple[str, str, dict | None]:
    """A GPU event's category, what within it (an op or kernel name) and the GEMM op that launched it (None: no
    GEMM op, or one without recorded shapes), from the host spans around its launch."""
    name = event.get("name", "")
    gemm = next((e for e in reversed(context) if e.get("name") in GEMM_OPS), None)
    shape = gemm_shape(gemm.get("args", {}).get("Input Dims", [])) if gemm else None
    op = gemm if shape else None
    if any(e.get("name") == HEAD_RANGE for e in context) or _triton_category(name) == HEAD:
        return HEAD, (gemm["name"] if gemm else name), op
    if shape:
        return f"GEMM {shape[1]:,}×{shape[2]:,}", gemm["name"], op
    triton = _triton_category(name)
    if triton is not None:
        return triton, name, None
    if name.startswith(FLA_KERNELS):
        return CHUNKED, name.split("(")[0][:60], None
    if _cat(event) in ("gpu_memcpy", "gpu_memset"):
        return COPIES, name, None
    if any(word in name.lower() for word in GEMM_KERNEL_WORDS):
        return GEMM_UNKNOWN, "", None
    host_op = next((e for e in reversed(context) if _cat(e) == "cpu_op"), None)
    if host_op is not None:
        return TORCH, host_op["name"], None
    if "at::native" in name:
        return TORCH, "in a CUDA graph replay", None
    return OTHER, name[:60], None


def categorise(events: list[dict], wall_us: float) -> list[Row]:
    """The rows of one profiled call (Chrome trace events; ``wall_us`` its wall time), largest first, host gaps
    included; GEMM rows give their launches and rows M, the LM head its rows through the head GEMM."""
    spans = [e for e in events if e.get("ph") == "X" and "ts" in e]
    contexts = launch_contexts(spans)
    gpu = [e for e in spans if _cat(e) in GPU_CATEGORIES]
    time_us, flops, rows, launches, kernels = Counter(), Counter(), Counter(), Counter(), Counter()
    parts: dict[str, Counter] = defaultdict(Counter)
    seen: set[int] = set()  # GEMM ops counted (an op may launch more than one kernel: split-K's reduction)
    for e in gpu:
        args = e.get("args", {})
        context = contexts.get(args.get("correlation")) or contexts.get(("op", args.get("External id")), ())
        category, part, op = classify(e, context)
        time_us[category] += e.get("dur", 0)
        parts[category][part] += e.get("dur", 0)
        kernels[category] += 1
        if op is not None and id(op) not in seen:
            seen.add(id(op))
            m, n, k = gemm_shape(op["args"]["Input Dims"])
            flops[category] += 2.0 * m * n * k
            rows[category] += m
            launches[category] += 1
    out = [
        Row(c, us, _detail(c, parts[c], launches[c], rows[c], kernels[c]), flops[c] if c != HEAD else 0.0)
        for c, us in time_us.items()
    ]
    busy = merged([(e["ts"], _end(e)) for e in gpu])
    busy_us = sum(b - a for a, b in busy)
    between = (busy[-1][1] - busy[0][0] - busy_us) if busy else 0.0
    host = max(wall_us - busy_us, 0.0)
    edges = host - between
    note = f"between kernels {between / 1e3:.2f} ms, before the first and after the last {edges / 1e3:.2f} ms"
    out.append(Row(HOST, host, note if busy else "no GPU activity"))
    return sorted(out, key=lambda r: -r.us)


def _detail(category: str, parts: Counter, launches: int, rows: int, kernels: int) -> str:
    if category == HEAD:
        through = f"; {rows:,} rows through the head GEMM in {launches} launches" if rows else ""
        return f"{kernels} kernels{through}"
    if category.startswith("GEMM") and rows:
        return f"{launches} launches, {rows:,} rows in all ({', '.join(sorted(p for p in parts if p))})"
    named = ", ".join(f"{p} {us / 1e3:.2f} ms" for p, us in parts.most_common(3) if p)
    return f"{kernels} kernels" + (f": {named}" if named else "")


def table(rows: list[Row], wall_us: float, passes: int) -> list[str]:
    """Markdown rows: category, time, time per pass, share of ``wall_us``, achieved TFLOP/s (GEMMs), detail; then
    the totals."""
    lines = ["| category | time (ms) | per pass (ms) | share | TFLOP/s | detail |", "|---|---|---|---|---|---|"]
    each = max(passes, 1)
    for r in rows:
        rate = f"{r.flops / r.us / 1e6:,.0f}" if r.flops and r.us else ""
        lines.append(
            f"| {r.category} | {r.us / 1e3:,.2f} | {r.us / each / 1e3:,.2f} | {r.us / wall_us:.1%} | {rate} | "
            f"{r.detail} |"
        )
    gemm = sum(r.us for r in rows if r.category.startswith("GEMM"))
    total = sum(r.us for r in rows)
    for what, us in (("all GEMMs (the LM head apart)", gemm), ("sum of the rows (overlap counts twice)", total)):
        lines.append(f"| {what} | {us / 1e3:,.2f} | {us / each / 1e3:,.2f} | {us / wall_us:.1%} |  |  |")
    return lines


@contextlib.contextmanager
def head_range(model, read_rows: list[int]):
    """``model.option_logprobs`` inside `HEAD_RANGE` while the block runs (an instance attribute over the method),
    each call's read rows (its hidden rows, before the head pads them to whole chunks) appended to ``read_rows``."""
    import torch

    method = model.option_logprobs

    def ranged(hidden_rows, *args, **kwargs):
        read_rows.append(hidden_rows.shape[0])
        with torch.profiler.record_function(HEAD_RANGE):
            return method(hidden_rows, *args, **kwargs)

    model.option_logprobs = ranged
    try:
        yield
    finally:
        del model.option_logprobs


def profiled_call(call, model, device, trace: Path) -> tuple[float, int]:
    """One call under the profiler (its Chrome trace written to ``trace``): its wall time in microseconds and the
    rows its LM head read (0 on the CPU, whose head is another method)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    cuda = device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    if cuda:
        torch.cuda.synchronize(device)
    read_rows: list[int] = []
    with profile(activities=activities, record_shapes=True) as prof, head_range(model, read_rows):
        started = time.perf_counter()
        call()
        if cuda:
            torch.cuda.synchronize(device)
        wall = time.perf_counter() - started
    prof.export_chrome_trace(str(trace))
    return wall * 1e6, sum(read_rows)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    from benchmarks.results import RESULTS
    from benchmarks.shapes import SHAPES
    from spinf.settings.table import DEFAULT_TOKEN_BUDGET

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--jobs", default="J1,J2", help="comma-separated job sets; each one's first body is profiled")
    p.add_argument("--device", default="cuda")
    p.add_argument("--shape", choices=SHAPES, default="12b", help="the 12B (default) or the 31B")
    p.add_argument("--scaled", action="store_true", help="a 2-layer, 64-wide model (the CPU smoke run)")
    p.add_argument("--layers", type=int, default=None, help="the 12B width with only this many layers")
    p.add_argument("--work", type=Path, default=None, help="where the checkpoint folder goes (default: temporary)")
    p.add_argument("--token-budget", type=int, default=DEFAULT_TOKEN_BUDGET)
    p.add_argument("--max-inputs", type=int, default=None, help="keep only the first N inputs of each body")
    p.add_argument("--repeats", type=int, default=3, help="unprofiled calls per job set (their median is shown)")
    p.add_argument("--trace-dir", type=Path, default=None, help="keep each job set's Chrome trace here, gzipped")
    p.add_argument(
        "--results", type=Path, nargs="?", const=RESULTS, default=None, help="append the tables (to RESULTS.md)"
    )
    args = p.parse_args(argv)
    args.scheme = "fp8s"  # what gpu_fast's engine loading reads
    return args


def job_lines(args, engine, name: str, body: dict, peak: float | None, flops_per_token: float, trace: Path):
    """The section of one job set: its header line and its table."""
    from benchmarks.gpu_jobsets import engine_call

    device = engine.device
    unprofiled = [engine_call(engine, body) for _ in range(args.repeats)]
    seconds = statistics.median(c.seconds for c in unprofiled)
    found = []

    def run() -> None:
        found.append(engine_call(engine, body))

    wall_us, read_rows = profiled_call(run, engine.model, device, trace)
    call = found[0]
    rows = categorise(json.loads(trace.read_text())["traceEvents"], wall_us)

    def mfu(s: float) -> str:
        return f"MFU {call.tokens * flops_per_token / s / (peak * 1e12):.1%}" if peak else "no MFU on the CPU"

    head_rows = f"; the LM head read {read_rows:,} rows" if read_rows else ""  # the CPU's head is another method
    head = (
        f"**{name}** (its first body): {call.questions:,} questions, {call.tokens:,} tokens run in {call.passes} "
        f"passes; call {seconds * 1e3:,.1f} ms unprofiled (median of {args.repeats}, {mfu(seconds)}), "
        f"{wall_us / 1e3:,.1f} ms under the profiler ({mfu(wall_us / 1e6)}){head_rows}; shares of the profiled call"
    )
    return ["", head, "", *table(rows, wall_us, call.passes)]


def main(argv: list[str] | None = None) -> None:
    import torch

    from benchmarks.checkpoint import work_dir
    from benchmarks.gpu_fast import fp8_peak_tflops, load_engine, warm_up
    from benchmarks.gpu_jobsets import Bench, Report, read_jobs
    from benchmarks.results import append_section
    from benchmarks.shapes import model_config, model_title, model_vision

    args = parse_args(argv)
    device = torch.device(args.device)
    peak = fp8_peak_tflops(device)
    lines: list[str] = []
    with work_dir(args.work) as root, tempfile.TemporaryDirectory(prefix="spinf-breakdown-") as temporary:
        if args.trace_dir is not None:
            args.trace_dir.mkdir(parents=True, exist_ok=True)
        jobs = read_jobs(args)
        bench = Bench(args, jobs, device, model_config(args), root, Report(None), peak, vision=model_vision(args))
        engine, setup = load_engine(args, bench)
        warm = warm_up(engine, jobs, device)
        print(f"{setup}; warm-up {warm:.1f} s", flush=True)
        for name, bodies in jobs.items():
            trace = Path(temporary) / f"{name}.json"
            new = job_lines(args, engine, name, bodies[0], peak, bench.flops_per_token, trace)
            if args.trace_dir is not None:  # for chrome://tracing or Perfetto, which read it gzipped
                (args.trace_dir / f"{name}.json.gz").write_bytes(gzip.compress(trace.read_bytes()))
            print(*new, sep="\n", flush=True)
            lines += new
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else (platform.processor() or "cpu")
    command = " ".join(["python", "benchmarks/breakdown.py", *(sys.argv[1:] if argv is None else argv)])
    rate = f"{peak:,.0f} TFLOP/s (the MFU denominator)" if peak else "none on the CPU"
    intro = (
        f"- command: `{command}`; device: {gpu}; torch {torch.__version__}, CUDA {torch.version.cuda}\n"
        f"- {model_title(args)} in fp8s ({setup}); one warm call per job set under torch.profiler; the fp8 "
        f"`_scaled_mm` peak measured in this run: {rate}\n"
        "- GEMM rows are named out × in (N×K); shares are of the profiled call's wall time"
    )
    if args.results is not None:
        append_section(f"Where a call's time goes ({', '.join(jobs)})", intro + "\n" + "\n".join(lines), args.results)


if __name__ == "__main__":
    main()
