"""Issue 11's comparison in one command: ours in-process and over HTTP, and the reference engine, on one folder.

Run on the GPU machine: ``python benchmarks/versus.py [--layers N] [--results FILE] [--json FILE] [--logs DIR]``
(the wheels of README's device notes installed, spinf-serve 0.1.1's among them). In one process and its children:

1. the fp8 ``_scaled_mm`` peak of this GPU (the MFU denominator);
2. one checkpoint folder (`benchmarks.checkpoint`: the 12B shape, random bf16 weights in sharded safetensors,
   ``config.json``, the tiny tokenizer), and our fp8s scale table for it (``spinf-serve calibrate``'s code on the
   folder in bf16, over the first inputs of J1–J3), shipped in the folder;
3. (a) ours in-process: an `Engine` in fp8s on the folder (the catalog model ``bench/gemma12b-random`` with
   ``--model-dir``), J1 (24 news-length inputs × 56 questions) and J2 (256 short messages × 106 questions) as one
   `Engine.score` call each: questions/s, MFU on tokens run, peak memory; each also once with the floor cache off;
   J3 (one ~230-word content × 20 questions) ``--latency-calls`` times, one after another;
4. (b) ``spinf-serve serve`` (``python -m spinf serve``) on the same folder, started as a child process: J2 as 256
   concurrent HTTP calls of one input and all 106 questions each, against (a)'s one call (target ≥ 0.90), and the
   bits of every answer against (a)'s; (c) J3 over HTTP one call after another, warm: p50 / p99 (≤ 20 / 25 ms);
5. (d) the reference engine, spinf-serve 0.1.1, in a child process of its own (`benchmarks.reference`, which says
   how it is configured) on the same folder and bodies, J1 and J2 one call each: ours / reference (target ≥ 2.0);
6. (e) with ``--baseline``: the transformers prefix-cache baseline (`benchmarks.baseline`) on J1.

Every line is printed and appended to ``--results`` (default benchmarks/RESULTS.md) as it is measured, under a
header naming the command, GPU, date and revision (``GIT_SHA`` where the tree has no git history); ``--json``
gets every figure. ``--device cpu --scaled`` is the smoke test: fp32, the folder served by its path, no reference.
"""

from __future__ import annotations

import argparse
import collections
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.baseline import BENCH_LIMITS  # noqa: E402
from benchmarks.checkpoint import (  # noqa: E402
    MODEL_ID,
    Folder,
    calibrate_folder,
    free_memory,
    open_engine,
    reference_scales,
    text_state,
    work_dir,
    write_checkpoint,
    write_manifest,
)
from benchmarks.gemma12b import build_random_transformers_model, decoder_linear_params  # noqa: E402
from benchmarks.gpu_fast import calibration_corpus, fp8_peak_tflops  # noqa: E402
from benchmarks.gpu_jobsets import (  # noqa: E402
    RESULTS,
    Report,
    baseline_call,
    engine_call,
    job_bodies,
    measure,
    note_row,
    row,
    small,
    tiny_tokenizer,
)
from benchmarks.http_load import ServerProcess, concurrent, one_after_another, percentile  # noqa: E402
from benchmarks.invariance import differing_bits, keyed, keyed_logprobs, merged, one_per_input  # noqa: E402
from benchmarks.results import revision  # noqa: E402
from benchmarks.shapes import model_config, model_title  # noqa: E402
from spinf.engine import hostgc  # noqa: E402
from spinf.engine.loop import EngineLoop  # noqa: E402

PACED_PAUSE_S = 0.005
# issue 36: one small call over HTTP at p50 ≤ 15 ms, p99 ≤ 18 ms; peak memory at the default budgets ≤ 14.1 GiB
TARGETS = {"http_ratio": 0.90, "p50_ms": 15.0, "p99_ms": 18.0, "versus": 2.0, "peak_gib": 14.1}
JOBS = ("J1", "J2", "J3")


class Run:
    """What every part needs: the arguments, the folder, the bodies, where lines and figures go."""

    def __init__(self, args: argparse.Namespace, root: Path, folder: Folder, report: Report, peak: float | None):
        self.args, self.root, self.folder, self.report, self.peak = args, root, folder, report, peak
        self.device = torch.device(args.device)
        self.config = model_config(args)
        self.flops_per_token = 2 * decoder_linear_params(self.config)
        self.bodies = {name: job_bodies(name, args.max_inputs if name != "J3" else None)[0][0] for name in JOBS}
        self.figures: dict = {"folder": {"bytes": folder.num_bytes, "write_s": folder.write_s}}

    def line(self, job: str, text: str) -> None:
        self.report.line(note_row(job, text))

    def questions_per_s(self, part: str, job: str) -> float | None:
        return self.figures.get(part, {}).get(job, {}).get("questions_per_s")


def header(run: Run, command: str) -> None:
    import transformers

    args, device = run.args, run.device
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else (platform.processor() or "cpu")
    peak = f"{run.peak:.0f} TFLOP/s" if run.peak else "not measured"
    ours = (
        f"the catalog model {MODEL_ID} (--model-dir), fp8s with our scale table shipped in the folder"
        if run.folder.on_gpu
        else "fp32, the folder by its path (the CPU smoke test: no pass sharing across calls, no fp8)"
    )
    run.report.line(
        f"\n## Ours against the reference engine (spinf-serve 0.1.1) on {model_title(args)} — "
        f"{datetime.date.today().isoformat()}, revision {revision()}\n\n"
        f"- command: `{command}`; device: {gpu}; torch {torch.__version__}, CUDA {torch.version.cuda}, "
        f"transformers {transformers.__version__}, Python {platform.python_version()}\n"
        f"- one checkpoint folder for every runner, written in this run: random weights, "
        f"{decoder_linear_params(run.config):,} decoder linear parameters, sharded safetensors with config.json "
        "and the tiny tokenizer (8,192 ids, so token counts are its own, not Gemma's); the same bodies "
        "(fixtures/jobsets j1, j2, j3) for every runner\n"
        f"- ours: `Engine.score` in-process and `spinf-serve serve` over HTTP, both on the folder: {ours}; "
        "the reference: "
        "spinf-serve 0.1.1's ScoreService in a process of its own, fp8s with the same scales under its linears' "
        "names (benchmarks/reference.py)\n"
        f"- MFU: tokens run × 2 × linear parameters / time / the fp8 `_scaled_mm` peak measured in this run "
        f"({peak}); times are medians of timed rounds after one warm-up call of each body (the floor cache warm "
        "unless a row says otherwise)\n\n"
        "| job | runner | questions | time | questions/s | tokens run | passes | peak memory | MFU |\n"
        "|---|---|---|---|---|---|---|---|---|"
    )


def prepare(run: Run) -> dict:
    """The folder's scale table (ours, shipped in it); its setup line."""
    folder = run.folder
    written = f"written in {folder.write_s:.1f} s" if folder.write_s else "found"
    rate = f" ({folder.num_bytes / 2**30 / folder.write_s:.2f} GiB/s)" if folder.write_s else ""
    corpus = calibration_corpus()
    table, seconds = calibrate_folder(folder, run.root, corpus, BENCH_LIMITS)
    run.figures["calibrate_s"] = seconds
    run.line(
        "setup",
        f"checkpoint folder {folder.num_bytes / 2**30:.2f} GiB {written}{rate}; scale table from "
        f"{len(corpus)} bodies (the first 4 inputs of J1, J2 and J3) in {seconds:.1f} s, load included",
    )
    return table


def in_process(run: Run) -> dict:
    """(a): our figures, and J2's answers keyed for the HTTP comparison."""
    device, bodies = run.device, run.bodies
    started = time.perf_counter()
    quant = "fp8s" if run.folder.on_gpu else "fp32"
    engine = open_engine(run.folder, run.root, quant=quant, limits=BENCH_LIMITS)
    load_s = time.perf_counter() - started
    started = time.perf_counter()
    engine_call(engine, small(bodies["J1"]))
    for body in bodies.values():
        engine_call(engine, body)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    warm_s = time.perf_counter() - started
    hostgc.settle()  # as the server does once warm
    run.line("setup", f"ours: engine loaded in {load_s:.1f} s ({engine.quant}); warm-up {warm_s:.1f} s")
    found, limits = {}, (run.args.min_seconds, run.args.max_seconds)
    for name in JOBS:
        rounds = run.args.latency_calls if name == "J3" else run.args.rounds
        m = measure(lambda body: engine_call(engine, body), [bodies[name]], device, rounds, limits)
        runner = "ours, in-process, one call" + (f" ({rounds} calls, one after another)" if name == "J3" else "")
        run.report.line(row(name, runner, m, run.flops_per_token, run.peak))
        found[name] = figures(m, run)
        if name == "J2":
            j2_keyed = keyed_logprobs(bodies["J2"], m["logprobs"][0])
    found["J3 paced"] = paced_j3(run, engine)
    for name in ("J1", "J2"):
        found[f"{name} cold"] = cold_call(run, engine, name)
    run.figures["ours"] = found
    peaks = [f["peak_gib"] for f in found.values() if f.get("peak_gib") is not None]
    if peaks:
        met = "met" if max(peaks) <= TARGETS["peak_gib"] else "missed"
        run.line("setup", f"ours: peak memory {max(peaks):.1f} GiB (target ≤ {TARGETS['peak_gib']:g} GiB: {met})")
    return j2_keyed


def figures(m: dict, run: Run) -> dict:
    seconds = m["seconds"]
    mfu = m["tokens"] * run.flops_per_token / seconds / (run.peak * 1e12) if run.peak else None
    lat = m["latencies"]
    return {
        "seconds": seconds,
        "questions": m["questions"],
        "questions_per_s": m["questions"] / seconds,
        "tokens": m["tokens"],
        "passes": m["passes"],
        "peak_gib": m["peak_gib"],
        "mfu": mfu,
        "p50_ms": lat[len(lat) // 2] * 1000 if len(lat) >= 10 else None,
        "p99_ms": lat[int(0.99 * (len(lat) - 1))] * 1000 if len(lat) >= 10 else None,
    }


def paced_j3(run: Run, engine) -> dict:
    """J3 in-process again with a pause before each call, as calls come one after another over a network: the
    engine thread idles between calls as the server's does, which back-to-back calls never let it."""
    latencies, busy = [], []
    for _ in range(run.args.latency_calls):
        time.sleep(PACED_PAUSE_S)
        call = engine_call(engine, run.bodies["J3"])
        latencies.append(call.seconds)
        busy.append(call.busy or 0.0)
    lat, busy = sorted(latencies), sorted(busy)
    p50, p99 = percentile(lat, 0.5) * 1000, percentile(lat, 0.99) * 1000
    run.line(
        "J3",
        f"ours, in-process, one call after a {PACED_PAUSE_S * 1000:.0f} ms pause ({len(lat)} calls): p50 "
        f"{p50:.1f} ms, p99 {p99:.1f} ms; GPU busy median {percentile(busy, 0.5) * 1000:.1f} ms",
    )
    return {"p50_ms": p50, "p99_ms": p99, "busy_ms": percentile(busy, 0.5) * 1000}


def cold_call(run: Run, engine, name: str) -> dict:
    """One call through a loop of the same engine with no floor cache: what a first call with these questions pays."""
    loop = engine.new_loop(share_passes=engine.batch_invariant, floor_cache=0)
    call = EngineLoop.new_call(run.bodies[name], f"cold-{name}", trusted=True)
    started = time.perf_counter()
    with hostgc.paused():
        loop.run([call])
        call.unwrap()
    seconds = time.perf_counter() - started
    stats = loop.statistics()
    questions = sum(len(q.get("combinations") or [{}]) for q in run.bodies[name]["scoring"]["queries"])
    questions *= len(run.bodies[name]["inputs"])
    run.line(
        name,
        f"ours, in-process, one call with the floor cache off: {seconds:.3f} s, {questions / seconds:,.0f} "
        f"questions/s, {stats.packed_tokens:,} tokens run in {stats.passes} passes",
    )
    return {"seconds": seconds, "questions_per_s": questions / seconds, "tokens": stats.packed_tokens}


def server_args(run: Run) -> list[str]:
    queue = str(max(512, 2 * len(run.bodies["J2"]["inputs"])))
    if run.folder.on_gpu:
        model = [MODEL_ID, "--model-dir", str(run.folder.path), "--quant", "fp8s", "--device", "cuda:0"]
    else:
        model = [str(run.folder.path), "--device", "cpu"]  # the automatic scheme on the CPU: fp32
    return [*model, "--queue", queue, "--warmup", run.args.server_warmup]


def child_env(run: Run) -> dict[str, str]:
    manifests = write_manifest(run.root, run.folder)
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "SPINF_MANIFEST_DIRS": str(manifests), "HF_HUB_OFFLINE": "1", "PYTHONPATH": path}


def over_http(run: Run, ours_j2: dict) -> None:
    """(b) and (c): J2 as one call per input, all at once, and J3 one call after another, on a real server."""
    log = run.args.logs / "server.log"
    with ServerProcess(server_args(run), env=child_env(run), log=log, cwd=ROOT, python=sys.executable) as server:
        ready_s = server.start(run.args.ready_timeout)
        run.line("setup", f"spinf-serve serve ready in {ready_s:.1f} s (`{' '.join(server.argv[1:])}`)")
        j2_http(run, server.port, ours_j2)
        j3_http(run, server.port)
        code = server.stop()
    run.line("setup", f"the server exited with {code} after SIGTERM")


def j2_http(run: Run, port: int, ours_j2: dict) -> None:
    body = run.bodies["J2"]
    calls = one_per_input(body)
    concurrent(port, calls)  # the warm-up round
    walls, answers = [], []
    for _ in range(run.args.http_rounds):
        wall, answers = concurrent(port, calls)
        walls.append(wall)
    statuses = collections.Counter(status for status, _, _ in answers)
    ok = [(b, a) for b, (status, a, _) in zip(calls, answers, strict=True) if status == 200]
    got = merged([keyed(b, a["results"]) for b, a in ok])
    compared, differ = differing_bits(ours_j2, got)
    questions = len(got)
    seconds = statistics.median(walls)
    rate = questions / seconds
    latencies = sorted(s for _, _, s in answers)
    ratio = rate / run.questions_per_s("ours", "J2") if run.questions_per_s("ours", "J2") else None
    run.figures["http"] = {"J2": {"seconds": seconds, "walls": walls, "questions_per_s": rate, "ratio": ratio}}
    per_call = questions // max(1, len(ok))
    run.line(
        "J2",
        f"ours over HTTP, {len(calls)} concurrent calls (one input × {per_call} questions each): {seconds:.3f} s "
        f"(median of {len(walls)} rounds, after a warm-up round), {rate:,.0f} "
        f"questions/s; {ratio_text(ratio, 'of one call in-process', TARGETS['http_ratio'])}; statuses "
        f"{dict(statuses)}; per call p50 {percentile(latencies, 0.5):.2f} s, last {latencies[-1]:.2f} s; "
        f"{compared:,} questions against the in-process call: {differ} differ in any bit",
    )


def j3_http(run: Run, port: int) -> None:
    body, calls = run.bodies["J3"], run.args.latency_calls
    one_after_another(port, body, 20)  # warm: the compiled templates and the floors are cached by now
    seconds, answers = one_after_another(port, body, calls)
    lat = sorted(seconds)
    p50, p99 = percentile(lat, 0.5) * 1000, percentile(lat, 0.99) * 1000
    # the server's own view of each call (api spec §5.1 timing): where a call's time goes, inside the engine or not
    timing = {
        key: percentile(sorted(a["timing"][key] for a in answers if isinstance(a, dict)), 0.5)
        for key in ("wall_ms", "queue_ms", "compile_ms", "gpu_busy_ms")
    }
    run.figures["http"]["J3"] = {"p50_ms": p50, "p99_ms": p99, "calls": calls, "server_timing_p50": timing}
    spent = ", ".join(f"{k} {v}" for k, v in timing.items())
    run.line("J3", f"ours over HTTP, the answers' own timing, medians: {spent}")
    met = p50 <= TARGETS["p50_ms"] and p99 <= TARGETS["p99_ms"]
    run.line(
        "J3",
        f"ours over HTTP, one call after another on one connection, warm: p50 {p50:.1f} ms, p99 {p99:.1f} ms over "
        f"{calls} calls (target ≤ {TARGETS['p50_ms']:.0f} / {TARGETS['p99_ms']:.0f} ms: {'met' if met else 'missed'})",
    )


def ratio_text(ratio: float | None, what: str, target: float) -> str:
    if ratio is None:
        return f"no ratio ({what} not measured)"
    return f"{ratio:.2f}× {what} (target ≥ {target:.2f}: {'met' if ratio >= target else 'missed'})"


def reference(run: Run, table: dict) -> None:
    """(d): the reference engine in a child process on the same folder and bodies."""
    if not run.folder.on_gpu:
        run.line("reference", "not run: spinf-serve 0.1.1 needs a GPU")
        return
    scales = run.root / "reference-scales.json"
    scales.write_text(json.dumps(reference_scales(table["scales"])))
    out = run.root / "reference.json"
    command = [sys.executable, str(ROOT / "benchmarks" / "reference.py"), "--folder", str(run.folder.path)]
    command += ["--scales", str(scales), "--rounds", str(run.args.rounds), "--json", str(out)]
    for name in ("J1", "J2"):
        path = run.root / f"{name}.json"
        path.write_text(json.dumps(run.bodies[name]))
        command += ["--body", f"{name}={path}"]
    code = stream(command, run.args.logs / "reference.log", child_env(run), run.args.reference_timeout)
    if code != 0 or not out.exists():
        run.line("reference", f"failed (exit {code}); its output is in {run.args.logs / 'reference.log'}")
        return
    found = json.loads(out.read_text())
    run.figures["reference"] = {k: v for k, v in found.items() if k != "jobs"}
    run.line(
        "setup", f"reference {found['version']}: loaded in {found['load_s']:.1f} s, warm-up {found['warm_s']:.1f} s"
    )
    for name, job in found["jobs"].items():
        reference_row(run, name, job)


def reference_row(run: Run, name: str, job: dict) -> None:
    seconds, rate = job["seconds"], job["questions"] / job["seconds"]
    mfu = f"{job['packed_tokens'] * run.flops_per_token / seconds / (run.peak * 1e12):.1%}" if run.peak else "–"
    run.report.line(
        f"| {name} | reference 0.1.1, in-process, one call | {job['questions']:,} | {seconds:.3f} s "
        f"({len(job['rounds'])} rounds; GPU busy {job['gpu_busy_s']:.3f} s) | {rate:,.0f} | {job['packed_tokens']:,} "
        f"(its packed tokens) | – | {job['peak_gib']:.1f} GiB | {mfu} |"
    )
    ours = run.questions_per_s("ours", name)
    ratio = ours / rate if ours else None
    run.figures.setdefault("versus", {})[name] = {"reference_questions_per_s": rate, "ratio": ratio}
    run.line(name, f"ours / reference, one call: {ratio_text(ratio, 'the reference', TARGETS['versus'])}")


def stream(command: list[str], log: Path, env: dict[str, str], timeout: float) -> int:
    """Run ``command``, its output printed and written to ``log`` as it comes; its exit status (killed after
    ``timeout`` seconds: -9)."""
    with (
        log.open("w") as out,
        subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=ROOT
        ) as child,
    ):

        def copy() -> None:
            for text in child.stdout:
                out.write(text)
                print(text, end="", flush=True)

        copier = threading.Thread(target=copy)
        copier.start()
        try:
            code = child.wait(timeout)
        except subprocess.TimeoutExpired:
            child.kill()
            code = -9
        copier.join()
        return code


def baseline(run: Run) -> None:
    """(e): the transformers baseline with the folder's weights on J1."""
    dtype = torch.bfloat16 if run.folder.on_gpu else torch.float32
    state = text_state(run.folder.path)
    model = build_random_transformers_model(run.device, dtype, config=run.config, state=state)
    del state
    call = lambda body: baseline_call(model, tiny_tokenizer(), 64, body)  # noqa: E731
    call(small(run.bodies["J1"]))
    m = measure(call, [run.bodies["J1"]], run.device, run.args.rounds, (run.args.min_seconds, run.args.max_seconds))
    run.report.line(row("J1", "baseline (transformers, prefix cache)", m, run.flops_per_token, run.peak))
    ours, rate = run.questions_per_s("ours", "J1"), m["questions"] / m["seconds"]
    run.figures["baseline"] = {"J1": {"questions_per_s": rate}}
    if ours:
        run.line("J1", f"ours / baseline, one call: {ours / rate:.2f}×")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--scaled", action="store_true", help="a 2-layer, 64-wide model (the CPU smoke test)")
    p.add_argument("--layers", type=int, default=None, help="the 12B width with only this many layers")
    p.add_argument("--parts", default="ours,http,reference", help="of ours,http,reference,baseline")
    p.add_argument("--baseline", action="store_true", help="add the baseline part")
    p.add_argument("--rounds", type=int, default=3, help="timed rounds of J1 and J2 per runner")
    p.add_argument("--http-rounds", type=int, default=3, help="timed rounds of J2's concurrent calls")
    p.add_argument("--latency-calls", type=int, default=200, help="timed J3 calls, in-process and over HTTP")
    p.add_argument("--min-seconds", type=float, default=0.0)
    p.add_argument("--max-seconds", type=float, default=60.0)
    p.add_argument("--max-inputs", type=int, default=None, help="keep the first N inputs of J1 and J2")
    p.add_argument("--server-warmup", default="full", choices=("full", "short", "none"))
    p.add_argument("--ready-timeout", type=float, default=300.0)
    p.add_argument("--reference-timeout", type=float, default=420.0)
    p.add_argument("--work", type=Path, default=None, help="where the folder goes (default: a temporary one)")
    p.add_argument("--logs", type=Path, default=None, help="the server's and the reference's logs (default: --work)")
    p.add_argument("--results", type=Path, default=RESULTS)
    p.add_argument("--no-results", action="store_true")
    p.add_argument("--json", type=Path, default=None, help="every figure, as JSON")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    parts = set(args.parts.split(",")) | ({"baseline"} if args.baseline else set())
    device = torch.device(args.device)
    peak = fp8_peak_tflops(device)
    report = Report(None if args.no_results else args.results)
    with work_dir(args.work) as root:
        args.logs = args.logs or root
        args.logs.mkdir(parents=True, exist_ok=True)
        folder = write_checkpoint(root, model_config(args), device=device)
        run = Run(args, root, folder, report, peak)
        header(run, ("python benchmarks/versus.py " + " ".join(sys.argv[1:] if argv is None else argv)).strip())
        table = prepare(run)
        ours_j2 = in_process(run) if "ours" in parts else {}
        free_memory()
        if "http" in parts:
            over_http(run, ours_j2)
        if "reference" in parts:
            reference(run, table)
        if "baseline" in parts:
            baseline(run)
        if args.json is not None:
            args.json.write_text(json.dumps(run.figures, indent=1))


if __name__ == "__main__":
    main()
