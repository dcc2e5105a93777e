"""The host's share of a call, with the device faked: the collector running between steps against paused for the call.

Run anywhere: ``python benchmarks/host_work.py [--jobs J2] [--repeats 3]``. Each job set's first body goes through
the engine loop as `Engine.score` sends it (parse, compile input by input, schedule, lay out, plan the kernels,
read back, build results) on the built-in tiny model's engine whose runner is replaced by one whose passes are laid
out and planned as for the 12B on a GPU and return constant log-probs at once, so only host work is timed. The
loop pauses the cyclic collector inside each step; `Engine.score` also pauses it for the whole call. Each round
times the call both ways; the ratio of the medians is printed (absolute times belong to this machine only).
Nothing is written to RESULTS.md.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.baseline import BENCH_LIMITS  # noqa: E402
from benchmarks.gpu_jobsets import job_bodies  # noqa: E402
from spinf.engine import hostgc  # noqa: E402
from spinf.engine.engine import Engine  # noqa: E402
from spinf.engine.kernels import kernel_plan, tile_rows  # noqa: E402
from spinf.engine.loop import EngineLoop  # noqa: E402
from spinf.engine.scorer import Launched, Scorer  # noqa: E402

# the 12B's layer kinds: (head dim, query heads per KV head)
LAYER_KINDS = {(256, 2), (512, 16)}


class HostOnlyScorer(Scorer):
    """A runner without a model: each pass is laid out and planned as on a GPU, and reads back -0.5 everywhere."""

    def __init__(self):
        self.device = torch.device("cpu")
        self._tile_sizes = LAYER_KINDS

    def launch(self, layout) -> Launched:
        kernel_plan(layout, self.device, {tile_rows(dim, group) for dim, group in LAYER_KINDS})
        picks = sum(len(cols) for cols in layout.read_columns)
        return Launched(torch.full((picks,), -0.5), 0.0)


def host_only_loop() -> EngineLoop:
    """The tiny engine's loop with `HostOnlyScorer` as its runner, its passes shared as under fp8s on a GPU."""
    engine = Engine("spinf/tiny-gemma4", device="cpu", limits=BENCH_LIMITS)
    engine.scorer = HostOnlyScorer()
    return engine.new_loop(share_passes=True, floor_cache=0)


def timed_call(loop: EngineLoop, body: dict, paused: bool) -> float:
    """One call through the loop; with ``paused`` the collector is also paused around it, as `Engine.score` does."""
    call = EngineLoop.new_call(body, "host-work", trusted=True)
    started = time.perf_counter()
    if paused:
        with hostgc.paused():
            loop.run([call])
            call.unwrap()
    else:
        loop.run([call])
        call.unwrap()
    seconds = time.perf_counter() - started
    del call
    return seconds


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--jobs", default="J2")
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args(argv)
    loop = host_only_loop()
    gc.enable()
    for name in args.jobs.split(","):
        bodies, _ = job_bodies(name.strip(), None)
        body = bodies[0]
        timed_call(loop, body, paused=True)  # warm caches (tokenizer, templates)
        running, paused = [], []
        for _ in range(args.repeats):
            running.append(timed_call(loop, body, paused=False))
            paused.append(timed_call(loop, body, paused=True))
        ratio = statistics.median(running) / statistics.median(paused)
        print(f"{name}: host work {ratio:.2f}x as long with the collector running as with it paused", flush=True)


if __name__ == "__main__":
    main()
