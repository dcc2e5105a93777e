"""Two source trees of spinf on one checkpoint folder: the same questions/s (within a tolerance) and the same bits.

A restructure promises no change in speed or numbers. This runs the job sets through ``Engine.score`` from two
trees, a ``--before`` tree (any folder holding a ``spinf/`` package, e.g. ``git archive REV spinf | tar -x -C
DIR``) and this checkout, on one checkpoint folder, one scale table and the same bodies, in alternating processes
(before, this, before, this, …), and compares every option's log-probability bit for bit and each job set's
questions/s as a ratio.

    python benchmarks/side_by_side.py --before /tmp/before --work /dev/shm/g12

On a GPU the folder is the 12B-shaped random checkpoint that `benchmarks/gpu_fast.py` writes and calibrates (run
once here, in this tree, unless the folder is there); with ``--device cpu`` a scaled model in fp32, for tests. Each
process imports ``spinf`` from its own tree and only its public face: `Engine`, `Limits`.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
JOBS = ("J1", "J2", "J3")
TOLERANCE = 0.03  # issue 34: the same questions/s within 3 %


def _worker(args: argparse.Namespace) -> None:
    """One tree's run: the engine from ``args.tree``, each job set warmed once then timed; a JSON line out."""
    sys.path.insert(0, str(Path(args.tree).resolve()))
    import torch

    import spinf
    from spinf import Engine
    from spinf.settings import Limits

    spec = json.loads(Path(args.spec).read_text())
    os.environ.update(spec.get("env", {}))
    started = time.perf_counter()
    engine = Engine(
        spec["model"],
        device=spec["device"],
        quant=spec["quant"],
        model_dir=spec.get("model_dir"),
        limits=Limits(max_content_tokens=spec["max_content_tokens"]),
        token_budget=spec["token_budget"],
    )
    load_s = time.perf_counter() - started
    cuda = spec["device"].startswith("cuda")
    out: dict = {"tree": str(Path(spinf.__file__).resolve().parent.parent), "load_s": load_s, "jobs": {}}
    for job, bodies in spec["bodies"].items():
        for body in bodies:  # warm-up: every kernel shape of this job compiles here
            engine.score(body, trusted=True)
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        times, logprobs = [], []
        for round_ in range(spec["repeats"][job]):
            began = time.perf_counter()
            responses = [engine.score(body, trusted=True) for body in bodies]
            times.append(time.perf_counter() - began)
            if round_ == 0:
                logprobs = [
                    o["logprob"].hex()
                    for r in responses
                    for res in r["results"]
                    for q in res["queries"]
                    for c in q["combinations"]
                    for o in c["options"]
                ]
        questions = _questions(responses)
        out["jobs"][job] = {
            "seconds": times,
            "questions": questions,
            "logprobs": logprobs,
            "peak_gib": torch.cuda.max_memory_allocated() / 2**30 if cuda else 0.0,
        }
    print("SIDE-BY-SIDE " + json.dumps(out), flush=True)


def _questions(responses: list[dict]) -> int:
    """Questions answered: one per input, query and combination."""
    return sum(len(q["combinations"]) for r in responses for res in r["results"] for q in res["queries"])


def _prepare(args: argparse.Namespace) -> dict:
    """The checkpoint folder, its scale table and the bodies, made in this tree; the spec every worker reads."""
    sys.path.insert(0, str(ROOT))
    from benchmarks.gpu_jobsets import job_bodies

    work = Path(args.work).resolve()
    work.mkdir(parents=True, exist_ok=True)
    bodies = {}
    for job in args.jobs.split(","):
        found, note = job_bodies(job, args.max_inputs)
        if found is None:
            raise SystemExit(f"{job}: {note}")
        bodies[job] = found
    spec: dict = {"device": args.device, "token_budget": args.token_budget, "max_content_tokens": 65_536}
    spec["bodies"] = bodies
    spec["repeats"] = {job: args.repeats * (20 if job == "J3" else 1) for job in bodies}
    if args.device == "cpu":
        import torch

        from benchmarks.checkpoint import write_checkpoint
        from benchmarks.gpu_jobsets import parse_args
        from benchmarks.shapes import model_config

        config = model_config(parse_args(["--device", "cpu", "--scaled"]))
        folder = write_checkpoint(work, config, device=torch.device("cpu"))
        spec |= {"model": str(folder.path), "quant": "fp32", "model_dir": None}
    else:
        if not list(work.glob("*/spinf_scales.json")):
            command = [sys.executable, str(ROOT / "benchmarks/gpu_fast.py"), "--jobs", "J3", "--work", str(work)]
            subprocess.run([*command, "--no-results", "--repeats", "1", "--max-seconds", "1"], check=True, cwd=ROOT)
        folder = next(work.glob("*/spinf_scales.json")).parent
        spec |= {"model": "bench/gemma12b-random", "quant": "fp8s", "model_dir": str(folder)}
        spec["env"] = {"SPINF_MANIFEST_DIRS": str(work / "manifests")}
    return spec


def _run(tree: Path, spec_path: Path) -> dict:
    command = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--worker",
        "--tree",
        str(tree),
        "--spec",
        str(spec_path),
    ]
    done = subprocess.run(command, capture_output=True, text=True, cwd=tree)
    lines = [line for line in done.stdout.splitlines() if line.startswith("SIDE-BY-SIDE ")]
    if done.returncode or not lines:
        raise SystemExit(
            f"the run in {tree} failed ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-6000:]}"
        )
    return json.loads(lines[-1].removeprefix("SIDE-BY-SIDE "))


def compare(runs: dict[str, list[dict]], jobs: list[str]) -> tuple[list[str], bool]:
    """Markdown rows (one per job set) and whether every bit and every ratio held."""
    rows, held = [], True
    for job in jobs:
        sides = {}
        for side, results in runs.items():
            times = [t for r in results for t in r["jobs"][job]["seconds"]]
            first = results[0]["jobs"][job]
            sides[side] = (first["questions"] / statistics.median(times), first, results)
        (qb, before, b_runs), (qa, _, a_runs) = sides["before"], sides["after"]
        bits = [r["jobs"][job]["logprobs"] for r in b_runs + a_runs]
        differ = sum(1 for values in zip(*bits, strict=True) if len(set(values)) > 1)
        ratio = qa / qb
        held &= differ == 0 and ratio >= 1 - TOLERANCE
        peak = max(r["jobs"][job]["peak_gib"] for r in a_runs)
        rows.append(
            f"| {job} | {before['questions']:,} | {qb:,.0f} | {qa:,.0f} | {ratio:.3f} | "
            f"{len(bits[0]):,} log-probs, {differ} differ in any bit | {peak:.1f} GiB |"
        )
    return rows, held


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--before", type=Path, help="a folder holding the spinf package to compare against")
    p.add_argument("--work", type=Path, default=Path("/dev/shm/side-by-side"), help="the checkpoint folder's root")
    p.add_argument("--jobs", default="J1,J2,J3")
    p.add_argument("--device", default="cuda")
    p.add_argument("--token-budget", type=int, default=16_384)
    p.add_argument("--repeats", type=int, default=3, help="timed rounds per process (J3: 20 times this)")
    p.add_argument("--rounds", type=int, default=2, help="processes per tree, alternating")
    p.add_argument("--max-inputs", type=int, default=None)
    p.add_argument("--results", type=Path, default=None, help="append the section to this file (RESULTS.md)")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--tree", help=argparse.SUPPRESS)
    p.add_argument("--spec", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        return _worker(args)
    if args.before is None or not (args.before / "spinf").is_dir():
        raise SystemExit("--before must name a folder holding a spinf/ package")
    spec = _prepare(args)
    spec_path = Path(args.work).resolve() / "side-by-side.json"
    spec_path.write_text(json.dumps(spec))
    runs: dict[str, list[dict]] = {"before": [], "after": []}
    for _ in range(args.rounds):
        for side, tree in (("before", args.before.resolve()), ("after", ROOT)):
            runs[side].append(_run(tree, spec_path))
            print(f"{side}: loaded in {runs[side][-1]['load_s']:.1f} s from {runs[side][-1]['tree']}", flush=True)
    jobs = list(spec["bodies"])
    rows, held = compare(runs, jobs)
    table = [
        "| job | questions | before q/s | after q/s | after / before | bits | peak (after) |",
        "|---|---|---|---|---|---|---|",
        *rows,
    ]
    command = "python benchmarks/side_by_side.py " + " ".join(sys.argv[1:] if argv is None else argv)
    device = spec["device"]
    if device.startswith("cuda"):
        import torch

        device = torch.cuda.get_device_name()
    body = (
        f"- command: `{command}`; device: {device}; {args.rounds} processes per tree, alternating; "
        f"times are medians of every timed round; bits: every option's log-probability of every round's first "
        f"pass over the bodies, all processes of both trees\n\n" + "\n".join(table) + "\n"
    )
    verdict = "held" if held else "NOT held"
    print(body + f"\nsame bits and questions/s within {TOLERANCE:.0%}: {verdict}")
    if args.results:
        sys.path.insert(0, str(ROOT))
        from benchmarks.results import append_section

        append_section(f"Side by side: {args.before} against this tree", body, args.results)
    raise SystemExit(0 if held else 1)


if __name__ == "__main__":
    main()
