"""Issue 5's measurement: the fp8s engine on the 12B-shaped random model, J1–J4, invariance, and the baseline.

Run on the GPU machine: ``python benchmarks/gpu_fast.py [--jobs J1,J2,J3,J4] [--baseline] [--invariance]``.

1. The fp8 GEMM peak of this GPU, measured first (a 16384 × 3840 × 15360 ``_scaled_mm``): the MFU denominator.
2. Our `Gemma4Text` in the 12B shape (engine spec B.19) with random bf16 weights, built on the GPU; fp8s scales
   from `spinf.engine.calibrate`'s recorder on a synthetic corpus (the first inputs of each job set); the linears
   quantized to e4m3 (`to_fp8s`), the bf16 weights released, memory statistics reset.
3. Warm-up (one small and one budget-filling call: Triton compiles here), timed.
4. Each job set through the engine as `Engine.score` runs it (parse, compile, pack, passes, results): questions/s,
   tokens run (no pads exist on this path), MFU = tokens run × 2 × linear parameters / time / fp8 peak, J3's p50
   and p99 over 100 calls, peak GPU memory.
5. ``--invariance``: every J1 question's log-probs alone, with its input's other questions, in all of J1, in J1
   shuffled, and in J1 scored in the same passes as J2; the number of differing bits is reported.
6. ``--timeline DIR``: one extra call per job set with the host's steps and the device's passes on one clock
   (`benchmarks/timeline.py`): where the device waited for the host.
7. ``--baseline``: the engine model is freed and transformers' model with the same weights scores the same bodies
   with each content's KV cache reused (`benchmarks.baseline`).

Lines go to stdout and are appended to benchmarks/RESULTS.md (``--results``) as they are measured.
"""

from __future__ import annotations

import argparse
import gc
import random
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.gemma12b import GEMMA_12B_TEXT_CONFIG, build_random_engine_model, scaled  # noqa: E402
from benchmarks.gpu_jobsets import (  # noqa: E402
    RESULTS,
    Bench,
    Report,
    engine_call,
    job_bodies,
    note_row,
    parse_body,
    tiny_tokenizer,
)
from benchmarks.gpu_probe import timed  # noqa: E402
from spinf.engine import hostgc  # noqa: E402
from spinf.engine.compiler import EngineShape, compile_request  # noqa: E402
from spinf.engine.engine import DEFAULT_MAX_TOKENS, DEFAULT_TOKEN_BUDGET, round_up  # noqa: E402
from spinf.engine.quant import AmaxRecorder  # noqa: E402
from spinf.engine.results import input_results  # noqa: E402
from spinf.engine.scorer import Scorer  # noqa: E402


def fp8_peak_tflops(device: torch.device) -> float | None:
    """The fp8 ``_scaled_mm`` rate at 16384 × 3840 × 15360 with bf16 output (the issue's MFU denominator)."""
    if device.type != "cuda":
        return None
    m, k, n = 16384, 3840, 15360
    a = torch.randn(m, k, device=device).clamp(-448, 448).to(torch.float8_e4m3fn)
    b = torch.randn(n, k, device=device).clamp(-448, 448).to(torch.float8_e4m3fn).t()
    one = torch.ones((), device=device)
    seconds = timed(lambda: torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16))
    return 2 * m * k * n / seconds / 1e12


def calibration_corpus() -> list[dict]:
    """The synthetic calibration corpus: the first 4 inputs of J1, J2 and J3, whatever ``--jobs`` says, so
    the scales (and so a recorded parity reference) do not depend on which job sets a run times."""
    corpus = []
    for name in ("J1", "J2", "J3"):
        bodies, _ = job_bodies(name, 4)
        corpus += bodies or []
    return corpus


def compiled(body: dict, tokenizer, shape: EngineShape):
    return compile_request(parse_body(body), tokenizer, shape)


def keyed(body: dict, results: list[dict]) -> dict:
    """``(input id, query id, combination values) -> option log-probs`` from a response's results."""
    out = {}
    for inp, res in zip(body["inputs"], results, strict=True):
        for q_body, q_res in zip(body["scoring"]["queries"], res["queries"], strict=True):
            combos = q_body.get("combinations") or [{}]
            for combo, c_res in zip(combos, q_res["combinations"], strict=True):
                key = (inp["id"], q_body["id"], tuple(sorted(combo.items())))
                out[key] = tuple(o["logprob"] for o in c_res["options"])
    return out


def score_keyed(scorer: Scorer, tokenizer, shape: EngineShape, bodies: list[dict]) -> list[dict]:
    """Several bodies as concurrent requests sharing passes; each body's keyed log-probs."""
    compiled_all = [compiled(b, tokenizer, shape) for b in bodies]
    values, _ = scorer.run_many([c.jobs for c in compiled_all])
    return [keyed(b, input_results(c, v)[0]) for b, c, v in zip(bodies, compiled_all, values, strict=True)]


def differing_bits(a: dict, b: dict) -> tuple[int, int]:
    """(questions compared, questions whose log-probs differ in any bit) over the keys of ``a``."""
    differ = sum(1 for key, value in a.items() if b.get(key) != value)
    return len(a), differ


def invariance(
    scorer: Scorer, tokenizer, shape: EngineShape, j1: dict, j2: dict | None, report: Report, max_alone: int | None
) -> None:
    queries = j1["scoring"]["queries"]
    (whole,) = score_keyed(scorer, tokenizer, shape, [j1])
    compositions = {}
    started = time.perf_counter()
    alone: dict = {}
    singles = [(inp, q, combo) for inp in j1["inputs"] for q in queries for combo in (q.get("combinations") or [{}])][
        :max_alone
    ]
    for inp, q, combo in singles:
        body = {"inputs": [inp], "scoring": {"queries": [{**q, "combinations": [combo]}]}}
        (one,) = score_keyed(scorer, tokenizer, shape, [body])
        alone.update(one)
    compositions[f"alone ({len(singles)} calls)"] = alone
    per_input: dict = {}
    for inp in j1["inputs"]:
        (one,) = score_keyed(scorer, tokenizer, shape, [{**j1, "inputs": [inp]}])
        per_input.update(one)
    compositions["with its input's other questions"] = per_input
    rng = random.Random(5)
    inputs = list(j1["inputs"])
    rng.shuffle(inputs)
    shuffled_queries = []
    for q in queries:
        combos = list(q.get("combinations") or [{}])
        rng.shuffle(combos)
        shuffled_queries.append({**q, "combinations": combos})
    (shuffled,) = score_keyed(scorer, tokenizer, shape, [{"inputs": inputs, "scoring": {"queries": shuffled_queries}}])
    compositions["J1 shuffled (inputs and combinations)"] = shuffled
    if j2 is not None:
        mixed, _ = score_keyed(scorer, tokenizer, shape, [j1, j2])
        compositions["J1 in the same passes as J2"] = mixed
    seconds = time.perf_counter() - started
    report.line(
        note_row("J1", f"invariance: reference = all of J1 in one call ({len(whole)} questions); {seconds:.0f} s")
    )
    for name, found in compositions.items():
        reference = {k: whole[k] for k in found} if name.startswith("alone") else whole
        n, differ = differing_bits(reference, found)
        report.line(note_row("J1", f"invariance, {name}: {n} questions compared, {differ} differ in any bit"))


def live_cuda_tensors(top: int = 6) -> str:
    """The largest CUDA tensors reachable from Python (a memory diagnostic), as one line."""
    seen = {}
    for obj in gc.get_objects():
        try:
            if isinstance(obj, torch.Tensor) and obj.is_cuda:
                seen[obj.untyped_storage().data_ptr()] = (obj.untyped_storage().nbytes(), tuple(obj.shape), obj.dtype)
        except Exception:  # noqa: BLE001 - objects that are not really tensors
            continue
    biggest = sorted(seen.values(), key=lambda t: -t[0])[:top]
    total = sum(v[0] for v in seen.values()) / 2**30
    return f"{total:.2f} GiB in {len(seen)} storages; largest: " + ", ".join(
        f"{shape} {str(dtype).removeprefix('torch.')} {size / 2**30:.2f} GiB" for size, shape, dtype in biggest
    )


def profile(call, body: dict, path: Path) -> None:
    """One call under torch.profiler; the kernels by total GPU time go to ``path``."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as profiler

    with profiler(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        call(body)
        torch.cuda.synchronize()
    table = prof.key_averages().table(sort_by="cuda_time_total", row_limit=40, max_name_column_width=70)
    path.write_text(table)
    print(table[:6000], flush=True)


def parity(args: argparse.Namespace, scorer: Scorer, tokenizer, report: Report) -> None:
    """The built-in parity fixture (engine spec B.15) on this model: recorded, or compared with a recording."""
    from spinf.engine.parity import check_reference, read_fixture, run_parity, write_fixture

    fixture = read_fixture(None)
    reference = read_fixture(args.parity_reference, flag="--parity-reference") if args.parity_reference else None
    if reference is not None:
        check_reference(fixture, reference, "--parity-reference")
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    name = f"12B-shaped random model (seed 0), fp8s from the benchmark's calibration; {gpu}"
    found = run_parity(scorer, tokenizer, fixture, reference, passes=2, record=name if args.parity_record else None)
    last = found["passes"][-1]
    if args.parity_record:
        write_fixture(found["recorded"], args.parity_record)
    text = (
        f"parity fixture ({len(fixture['jobs'])} jobs): last pass {last['wall_s']:.2f} s, {last['tok_s']:,.0f} tok/s"
    )
    if last.get("parity"):
        text += (
            f"; vs reference: exact share {last['parity']['lp_exact_share']}, max abs {last['parity']['lp_max_abs']}"
        )
    report.line(note_row("parity", text + (f"; recorded to {args.parity_record.name}" if args.parity_record else "")))


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--jobs", default="J1,J2,J3,J4")
    p.add_argument("--baseline", action="store_true")
    p.add_argument("--baseline-jobs", default="J1,J3")
    p.add_argument("--invariance", action="store_true")
    p.add_argument("--max-alone", type=int, default=None, help="cap the 'alone' calls of the invariance check")
    p.add_argument("--scheme", choices=("fp8s", "bf16"), default="fp8s")
    p.add_argument("--device", default="cuda")
    p.add_argument("--scaled", action="store_true", help="a 2-layer, 64-wide model (smoke test)")
    p.add_argument("--token-budget", type=int, default=DEFAULT_TOKEN_BUDGET)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--min-seconds", type=float, default=2.0)
    p.add_argument("--max-seconds", type=float, default=60.0)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--max-inputs", type=int, default=None)
    p.add_argument("--results", type=Path, default=RESULTS)
    p.add_argument("--no-results", action="store_true")
    p.add_argument("--profile", type=Path, default=None, help="profile one call of each job set into this folder")
    p.add_argument("--timeline", type=Path, default=None, help="host/device timeline of one call per job set, here")
    p.add_argument("--parity-record", type=Path, default=None, help="record the built-in parity fixture here")
    p.add_argument("--parity-reference", type=Path, default=None, help="compare the parity fixture with this file")
    args = p.parse_args(argv)
    if args.timeline is not None and not args.device.startswith("cuda"):
        p.error("--timeline times device passes with CUDA events: it needs --device cuda")
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    device = torch.device(args.device)
    config = scaled(GEMMA_12B_TEXT_CONFIG) if args.scaled else GEMMA_12B_TEXT_CONFIG
    report = Report(None if args.no_results else args.results)
    peak = fp8_peak_tflops(device)
    jobs = {}
    for name in [j.strip() for j in args.jobs.split(",") if j.strip()]:
        bodies, note = job_bodies(name, args.max_inputs)
        if bodies is not None:
            jobs[name] = bodies
        elif note:
            print(f"{name}: {note}; skipped", flush=True)
    tokenizer = tiny_tokenizer()
    shape = EngineShape(round_up(args.token_budget), round_up(DEFAULT_MAX_TOKENS))
    bench = Bench(args, jobs, device, torch.bfloat16, config, tokenizer, shape, report, peak)
    command = "python benchmarks/gpu_fast.py " + " ".join(sys.argv[1:] if argv is None else argv)
    bench.header(command.strip(), f"the engine's fused GPU path, {args.scheme}", "fp8 `_scaled_mm`")
    engine_part(args, bench)  # its model is freed when it returns
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    if args.baseline:
        bench.jobs = {k: v for k, v in jobs.items() if k in args.baseline_jobs.split(",")}
        bench.run_baseline()


def engine_part(args: argparse.Namespace, bench: Bench) -> None:
    """Build, calibrate and quantize the engine model, warm it up, time the job sets, check invariance."""
    device, config, tokenizer, shape, jobs, report = (
        bench.device,
        bench.config,
        bench.tokenizer,
        bench.shape,
        bench.jobs,
        bench.report,
    )
    started = time.perf_counter()
    model = build_random_engine_model(device, torch.bfloat16, config=config)
    scorer = Scorer(model, device, shape.token_budget)
    built = time.perf_counter() - started
    calibration = ""
    if args.scheme == "fp8s":
        started = time.perf_counter()
        recorder = AmaxRecorder()
        corpus = calibration_corpus()
        with model.observing(recorder.observe):
            for body in corpus:
                compiled_body = compiled(body, tokenizer, shape)
                scorer.run_many([compiled_body.jobs])
        if device.type == "cuda":
            print("live before to_fp8s:", live_cuda_tensors(), flush=True)
        model.to_fp8s(recorder.scales())
        seconds = time.perf_counter() - started
        calibration = f"; calibrated on {len(corpus)} bodies (the first 4 inputs of J1, J2 and J3) in {seconds:.1f} s"
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    weights_gib = torch.cuda.memory_allocated(device) / 2**30 if device.type == "cuda" else 0.0
    started = time.perf_counter()
    first = next(iter(jobs.values()))[0]
    engine_call(scorer, tokenizer, shape, {**first, "inputs": first["inputs"][:1]} if "inputs" in first else first)
    for bodies in jobs.values():  # one call of each job set's first body: every kernel shape compiles here
        engine_call(scorer, tokenizer, shape, bodies[0])
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    warm = time.perf_counter() - started
    hostgc.settle()  # as the server does once warm
    report.line(
        note_row(
            "setup",
            f"model built in {built:.1f} s{calibration}; weights resident {weights_gib:.2f} GiB; "
            f"warm-up (one call of each job set) {warm:.1f} s",
        )
    )
    if device.type == "cuda":
        print("live after warm-up:", live_cuda_tensors(), flush=True)
    if args.profile is not None:
        args.profile.mkdir(parents=True, exist_ok=True)
        for name, bodies in jobs.items():
            profile(lambda body: engine_call(scorer, tokenizer, shape, body), bodies[0], args.profile / f"{name}.txt")
    if args.timeline is not None:
        from benchmarks.timeline import Timeline

        args.timeline.mkdir(parents=True, exist_ok=True)
        for name, bodies in jobs.items():
            with Timeline(scorer) as timeline:
                engine_call(scorer, tokenizer, shape, bodies[0])
            text = timeline.report(name)
            (args.timeline / f"{name}.txt").write_text(text + "\n")
            lines = text.splitlines()
            print(
                "\n".join(lines[:1] + [line for line in lines if line.lstrip().startswith(("gap", "tail"))]),
                flush=True,
            )
    bench._run_jobs(lambda body: engine_call(scorer, tokenizer, shape, body), f"engine, {args.scheme}")
    if args.parity_record or args.parity_reference:
        parity(args, scorer, tokenizer, report)
    if args.invariance and "J1" in jobs:
        j2 = jobs.get("J2", [None])[0]
        invariance(scorer, tokenizer, shape, jobs["J1"][0], j2, report, args.max_alone)


if __name__ == "__main__":
    main()
