"""Scale-out: N ``spinf-serve serve`` replicas behind contrib/balancer's HAProxy, then the Ray Data job (issue 37).

``python benchmarks/scaleout.py`` on a machine with N GPUs writes the 12B-shaped random checkpoint once
(`benchmarks.checkpoint`, in a child process so this one holds no GPU memory; fp8s also ships a scale table, as
benchmarks/gpu_fast.py makes one) and starts one replica per GPU (``--device cuda:k``), all at once. On the CPU,
``--model tiny --device cpu --replicas 2`` starts two replicas of the built-in tiny model, each on its own port
with its share of the cores (``OMP_NUM_THREADS``), as one GPU each would be. Then:

1. **Bits.** Every call body is sent alone to every replica, one replica per thread: the results must be the same
   bytes on each (scoring is a pure read of the same weights); replica 0's are the reference.
2. **Rate per N.** For N = 1, 2, …, all (``--counts``): HAProxy with contrib/balancer/haproxy.cfg unchanged in front
   of replicas 0 … N-1, and ``--callers`` threads per replica, each with its own connection, calling it without a
   pause (`Callers`). After ``--warm-s``, the calls that end in the next ``--seconds`` count: questions/s, scaling
   efficiency (q/s(N) / (N × q/s(1))), per-call p50 and p99 at the client, failed calls, and answers whose results
   differ from the same body alone.
3. **Drain** (at the largest N, when it is 2 or more; ``--no-drain`` skips it): while the load goes on, the last
   replica is drained as contrib/kubernetes/prestop_drain.py drains a pod (``POST /v0/drain``, then the wait until
   it is quiet), then sent SIGTERM. Reported: failed calls at the client from the drain on (must be 0), the calls
   the replica answered after the drain began and its exit status, and the calls the others took meanwhile.
4. **Ray Data** (``--no-ray`` skips it; skipped with a message when ray is not installed): once the replicas are
   stopped, contrib/ray/score.py's job with one engine actor per GPU (per replica on the CPU) over the same inputs
   cycled ``--ray-repeat`` times. Its steady questions/s (over the second half of the inputs, past the actors'
   loading) against the replicas' rate at the same N, and its first lines against ``spinf-serve score`` in-process
   on the same inputs, byte for byte.

The calls are J2's messages (fixtures/jobsets/j2.json: 256 user messages × 106 questions), ``--inputs-per-call``
of them a call, with ``--questions`` keeping the first combinations of its query. ``--results`` appends the
section to benchmarks/RESULTS.md. HAProxy comes from ``--haproxy`` (default: the one on PATH, Debian's
``haproxy``).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import multiprocessing
import os
import shutil
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import attrs  # noqa: E402

from benchmarks.jobsets import load_jobset  # noqa: E402
from benchmarks.results import append_section, cpu_machine  # noqa: E402
from benchmarks.scaleout_http import Answer, Balancer, Callers, alone_results, drain_one  # noqa: E402
from benchmarks.scaleout_ray import RayJob, ray_lines  # noqa: E402
from contrib.loadtest.harness import ServerProcess, percentile, tiny_cache  # noqa: E402

TINY = "spinf/tiny-gemma4"
TOKEN, TRUSTED = "scaleout-token", "scaleout-trusted"
TABLE = (
    "| replicas | callers | calls | questions/s | scaling efficiency | p50 | p99 | failed | differ from alone |\n"
    "|---|---|---|---|---|---|---|---|---|"
)


@attrs.frozen
class Workload:
    """J2's inputs and its request part, cut to ``--max-inputs`` and ``--questions``; the call bodies made of them."""

    request: dict  # {"scoring": ...}: the part every body shares, the Ray job's request file
    inputs: list[dict]
    inputs_per_call: int

    @property
    def questions_per_input(self) -> int:
        return sum(len(query["combinations"]) for query in self.request["scoring"]["queries"])

    def bodies(self) -> list[dict]:
        step = self.inputs_per_call
        return [{**self.request, "inputs": self.inputs[k : k + step]} for k in range(0, len(self.inputs), step)]


def workload(args: argparse.Namespace) -> Workload:
    j2 = load_jobset("j2")
    queries = [
        {**query, "combinations": query["combinations"][: args.questions]} for query in j2["scoring"]["queries"]
    ]
    return Workload({"scoring": {**j2["scoring"], "queries": queries}}, j2["inputs"][: args.max_inputs], args.per_call)


@attrs.frozen
class Served:
    """How the replicas, ``spinf-serve score`` and the Ray actors open the model: the model argument, the flags
    beside it, the environment, and the words the report calls it by."""

    model: str
    flags: tuple[str, ...]
    env: dict[str, str]
    title: str
    machine: str


def prepare_folder(args: argparse.Namespace) -> Served:
    """The 12B-shaped checkpoint folder (written once; found on a later run with the same ``--work``) and, for
    fp8s, its scale table, served as ``spinf-serve serve`` serves it: on a GPU the catalog model with
    ``--model-dir``, on the CPU (no catalog model there) the folder by its path in fp32. Run in a child process,
    so that the GPU memory it took goes with it."""
    import torch

    from benchmarks.baseline import BENCH_LIMITS
    from benchmarks.checkpoint import calibrate_folder, write_checkpoint, write_manifest
    from benchmarks.gpu_fast import calibration_corpus
    from benchmarks.shapes import model_config, model_title
    from spinf.engine.scales import SHIPPED_TABLE

    args.shape = "12b"
    folder = write_checkpoint(args.work, model_config(args), device=torch.device(args.device))
    written = f"written in {folder.write_s:.0f} s" if folder.write_s else "found"
    title = f"{model_title(args)}, checkpoint folder {folder.num_bytes / 2**30:.1f} GiB {written}"
    env = {"HF_HOME": str(args.work / "hf"), "HF_HUB_OFFLINE": "1"}
    env["SPINF_MANIFEST_DIRS"] = str(write_manifest(args.work, folder))
    if not folder.on_gpu:
        return Served(str(folder.path), (), env, f"{title}, fp32", cpu_machine())
    if args.quant == "fp8s" and not (folder.path / SHIPPED_TABLE).exists():
        calibrate_folder(folder, args.work, calibration_corpus(), BENCH_LIMITS)
    flags = ("--model-dir", str(folder.path), "--quant", args.quant)
    machine = f"{torch.cuda.device_count()} × {torch.cuda.get_device_name(0)}, torch {torch.__version__}"
    return Served(folder.model_id, flags, env, f"{title}, {args.quant}", machine)


def served(args: argparse.Namespace) -> Served:
    if args.model == "tiny":
        env = {"HF_HOME": str(tiny_cache(args.work / "hf"))}
        return Served(TINY, (), env, "the built-in tiny model, fp32", cpu_machine())
    spawn = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(1, mp_context=spawn) as child:
        return child.submit(prepare_folder, args).result()


def start_replicas(args: argparse.Namespace, model: Served) -> list[ServerProcess]:
    """One ``spinf-serve serve`` per GPU (per share of the cores on the CPU), started at once, each ready."""
    count = args.replicas
    threads = str(max(1, (os.cpu_count() or 1) // count))
    queue = str(2 * args.callers + 4)  # every caller of its share at once, and room (haproxy.cfg: size --queue)
    flags = [*model.flags, "--token", TOKEN, "--trusted-token", TRUSTED, "--queue", queue, "--warmup", args.warmup]
    env = {**model.env, **({"OMP_NUM_THREADS": threads} if args.device == "cpu" else {})}
    devices = [f"cuda:{k}" for k in range(count)] if args.device == "cuda" else ["cpu"] * count
    hf_home, wait = Path(model.env["HF_HOME"]), args.ready_s

    def start(k: int) -> ServerProcess:
        folder, device = args.work / f"replica{k}", devices[k]
        (folder / "drain").unlink(missing_ok=True)  # an earlier run's drain marker: it outlives the process
        return ServerProcess(folder, *flags, model=model.model, env=env, hf_home=hf_home, device=device, ready_s=wait)

    with concurrent.futures.ThreadPoolExecutor(count) as pool:
        futures = [pool.submit(start, k) for k in range(count)]
    failed = [future.exception() for future in futures if future.exception() is not None]
    if failed:
        stop_all([future.result() for future in futures if future.exception() is None])
        raise RuntimeError(f"{len(failed)} of {count} replicas did not start: {failed[0]}")
    return [future.result() for future in futures]


def stop_all(servers: list[ServerProcess]) -> None:
    for server in servers:
        if server.process.poll() is None:
            server.stop()


@attrs.frozen
class Row:
    replicas: int
    callers: int
    calls: int
    questions_per_s: float
    p50_s: float
    p99_s: float
    failed: int  # answers other than 200 at the client, over the whole load (the drain included)
    differ: int  # 200s whose results differ from the same body scored alone on replica 0

    @classmethod
    def of(cls, n: int, callers: int, answers: list[Answer], counted: tuple[float, float], questions, reference):
        """The row of a load's ``answers``: the 200s that ended in the ``counted`` time make the rate and latencies;
        ``questions[k]`` and ``reference[k]`` are body k's questions and its results alone."""
        started, ended = counted
        window = [a for a in answers if a.status == 200 and started <= a.ended < ended]
        seconds = sorted(a.ended - a.started for a in window)
        return cls(
            n,
            callers,
            len(window),
            sum(questions[a.body] for a in window) / (ended - started),
            percentile(seconds, 0.5),
            percentile(seconds, 0.99),
            sum(a.status != 200 for a in answers),
            sum(a.status == 200 and a.results != reference[a.body] for a in answers),
        )


def measure(args, servers, payloads: list[bytes], questions: list[int], reference: list[str], report) -> list[Row]:
    """q/s per N through HAProxy; the drain of the last replica at the largest N (`drain_one`)."""
    rows: list[Row] = []
    for n in args.counts:
        with Balancer(args.haproxy, args.work / f"balancer-{n}", [r.port for r in servers[:n]]) as balancer:
            balancer.wait_up()
            load = Callers(balancer.url, payloads, args.callers * n, TOKEN)
            time.sleep(args.warm_s)
            started = time.monotonic()
            time.sleep(args.seconds)
            ended = time.monotonic()
            drained = n == args.counts[-1] and n >= 2 and args.drain
            lines = drain_one(servers[n - 1], servers[: n - 1], load, TRUSTED) if drained else []
            answers = load.stop()
        rows.append(Row.of(n, args.callers * n, answers, (started, ended), questions, reference))
        report(table_row(rows[-1], rows[0]))
        for line in lines:
            report(line)
    return rows


def table_row(row: Row, first: Row) -> str:
    efficiency = row.questions_per_s / (row.replicas * first.questions_per_s)
    return (
        f"| {row.replicas} | {row.callers} | {row.calls:,} | {row.questions_per_s:,.0f} | {efficiency:.2f} "
        f"| {row.p50_s * 1000:,.0f} ms | {row.p99_s * 1000:,.0f} ms | {row.failed} | {row.differ} |"
    )


def bits_line(alone: list[list[str]]) -> str:
    """Whether every replica gave the same bytes for every body sent to it alone."""
    differ = [k for k in range(len(alone[0])) if len({per_replica[k] for per_replica in alone}) > 1]
    verdict = "identical" if not differ else f"DIFFERENT on {len(differ)} bodies (the first: body {differ[0]})"
    return f"- bits: {len(alone[0])} bodies, each sent alone to each of {replicas(len(alone))}: {verdict}"


def replicas(count: int) -> str:
    return "1 replica" if count == 1 else f"{count} replicas"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.work.mkdir(parents=True, exist_ok=True)
    lines: list[str] = []

    def report(line: str) -> None:
        print(line, flush=True)
        lines.append(line)

    load = workload(args)
    model = served(args)
    command = " ".join(["python benchmarks/scaleout.py", *(sys.argv[1:] if argv is None else argv)])
    report(f"- command: `{command}`; machine: {model.machine}")
    report(
        f"- model: {model.title}; calls: J2's first {len(load.inputs)} messages × {load.questions_per_input} "
        f"questions, {load.inputs_per_call} a call ({len(load.bodies())} bodies); {args.callers} callers per "
        f"replica; {args.seconds:g} s counted after {args.warm_s:g} s; contrib/balancer/haproxy.cfg unchanged"
    )
    rows = over_http(args, model, load, report)
    if args.ray:
        rates = {row.replicas: row.questions_per_s for row in rows}
        for line in ray_lines(ray_job(args, model, load), rates.get(args.replicas)):
            report(line)
    if args.results:
        title = f"Scale-out: {replicas(args.replicas)} behind HAProxy and the Ray Data job (issue 37)"
        append_section(title, "\n".join(lines))
    return 0


def over_http(args: argparse.Namespace, model: Served, load: Workload, report) -> list[Row]:
    """The replicas started, their bits compared, then measured per N (and one drained); all stopped after."""
    bodies = load.bodies()
    payloads = [json.dumps(body).encode() for body in bodies]
    questions = [len(body["inputs"]) * load.questions_per_input for body in bodies]
    started = time.monotonic()
    servers = start_replicas(args, model)
    try:
        report(f"- {replicas(len(servers))} ready in {time.monotonic() - started:.0f} s (started at once)")
        alone = alone_results(servers, payloads, TOKEN)
        report(bits_line(alone))
        report("\n" + TABLE)
        return measure(args, servers, payloads, questions, alone[0], report)
    finally:
        stop_all(servers)


def ray_job(args: argparse.Namespace, model: Served, load: Workload) -> RayJob:
    """The Ray Data leg over the same inputs and model, one actor per replica."""
    on_gpu = args.device == "cuda"
    return RayJob(
        args.work,
        on_gpu,
        model.model,
        model.flags,
        model.env,
        load.request,
        load.inputs,
        load.questions_per_input,
        args.ray_repeat,
        args.ray_batch_size,
        args.replicas,
    )


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", choices=("12b", "tiny"), default="12b", help="the 12B-shaped checkpoint, or tiny")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--replicas", type=int, default=None, help="default: every GPU (2 on the CPU)")
    p.add_argument("--counts", default=None, help="the N measured, e.g. 1,2,4,8 (default 1, 2, …, --replicas)")
    p.add_argument("--quant", default="fp8s", help="the replicas' scheme on a GPU (fp8s: a scale table is made)")
    p.add_argument("--scaled", action="store_true", help="the 12B's architecture, 2 layers 64 wide")
    p.add_argument("--layers", type=int, default=None, help="the 12B's width with only this many layers")
    p.add_argument("--work", type=Path, default=Path("/tmp/spinf-scaleout"), help="checkpoint, logs (kept)")
    p.add_argument("--max-inputs", type=int, default=256, help="J2's first messages used (256: all)")
    p.add_argument("--questions", type=int, default=106, help="J2's first questions used (106: all)")
    p.add_argument("--per-call", type=int, default=4, help="messages a call")
    p.add_argument("--callers", type=int, default=None, help="callers per replica (default 32; 4 on the CPU)")
    p.add_argument("--seconds", type=float, default=20.0, help="the counted time per N")
    p.add_argument("--warm-s", type=float, default=3.0, help="load before the counted time")
    p.add_argument("--warmup", choices=("full", "short", "none"), default=None, help="the replicas' --warmup")
    p.add_argument("--ready-s", type=float, default=900.0, help="the longest wait for a replica")
    p.add_argument("--no-drain", dest="drain", action="store_false", help="no drain at the largest N")
    p.add_argument("--no-ray", dest="ray", action="store_false", help="no Ray Data job")
    p.add_argument("--ray-repeat", type=int, default=None, help="J2's inputs cycled this often (4 × N; CPU 1)")
    p.add_argument("--ray-batch-size", type=int, default=64, help="inputs per Ray batch and per reference batch")
    p.add_argument("--haproxy", default=shutil.which("haproxy") or "/usr/sbin/haproxy", help="the haproxy binary")
    p.add_argument("--results", action="store_true", help="append the section to benchmarks/RESULTS.md")
    args = p.parse_args(argv)
    return with_defaults(p, args)


def with_defaults(p: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.Namespace:
    """The defaults that depend on the device and the number of GPUs, and the checks across flags."""
    on_cpu = args.device == "cpu"
    if args.replicas is None:
        args.replicas = 2 if on_cpu else gpu_count()
    args.callers = args.callers or (4 if on_cpu else 32)
    args.warmup = args.warmup or ("short" if on_cpu else "full")
    args.ray_repeat = args.ray_repeat or (1 if on_cpu else 4 * args.replicas)
    args.counts = [int(n) for n in args.counts.split(",")] if args.counts else list(range(1, args.replicas + 1))
    if args.replicas < 1 or not all(1 <= n <= args.replicas for n in args.counts) or args.counts[0] != 1:
        p.error(f"--counts must start at 1 and stay within 1..{args.replicas} replicas, got {args.counts}")
    if args.model == "tiny" and not on_cpu:
        p.error("--model tiny runs on the CPU only (--device cpu)")
    if not Path(args.haproxy).exists():
        p.error(f"haproxy is not at {args.haproxy}: apt-get install haproxy, or give --haproxy")
    args.work = args.work.resolve()
    return args


def gpu_count() -> int:
    import torch

    count = torch.cuda.device_count()
    if count < 1:
        raise SystemExit("no GPU here: give --device cpu (and --model tiny)")
    return count


if __name__ == "__main__":
    sys.exit(main())
