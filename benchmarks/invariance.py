"""Per-question invariance: every question's log-probs, bit for bit, whatever else was scored with it.

A reference (one composition of the work) is compared with others: each question alone, with its input's other
questions only, the inputs and combinations shuffled, in the same passes as another job set, with the floor cache
off, and as many concurrent calls of one input each. Calls reach the device through the engine's loop as the
server's do (several calls in one `EngineLoop.run` share passes where the engine is batch-invariant). Used by
``benchmarks/gpu_fast.py --invariance``; `keyed` and `differing_bits` also by ``benchmarks/versus.py`` for answers
that came over HTTP.
"""

from __future__ import annotations

import random
import time

from benchmarks.gpu_jobsets import response_logprobs
from spinf.engine.engine import Engine
from spinf.engine.loop import EngineLoop

Keyed = dict[tuple, tuple[float, ...]]


def keyed(body: dict, results: list[dict]) -> Keyed:
    """``(input id, query id, combination values) -> option log-probs`` from a response's results."""
    return keyed_logprobs(body, response_logprobs(results))


def keyed_logprobs(body: dict, logprobs: list) -> Keyed:
    """The same from the nested lists of `benchmarks.gpu_jobsets.response_logprobs` (input, query, combination)."""
    out = {}
    for inp, per_input in zip(body["inputs"], logprobs, strict=True):
        for q_body, per_query in zip(body["scoring"]["queries"], per_input, strict=True):
            combos = q_body.get("combinations") or [{}]
            for combo, options in zip(combos, per_query, strict=True):
                out[(inp["id"], q_body["id"], tuple(sorted(combo.items())))] = tuple(options)
    return out


def differing_bits(a: Keyed, b: Keyed) -> tuple[int, int]:
    """(questions compared, questions whose log-probs differ in any bit, or are missing) over the keys of ``a``."""
    differ = sum(1 for key, value in a.items() if b.get(key) != value)
    return len(a), differ


def score_keyed(engine: Engine, bodies: list[dict], loop: EngineLoop | None = None) -> list[Keyed]:
    """Several bodies as concurrent calls in one run of ``loop`` (the engine's own by default); each one keyed."""
    loop = loop or engine.loop
    calls = [EngineLoop.new_call(body, f"invariance-{i}", trusted=True) for i, body in enumerate(bodies)]
    loop.run(calls)
    return [keyed(body, call.unwrap()["results"]) for body, call in zip(bodies, calls, strict=True)]


def one_per_input(body: dict) -> list[dict]:
    """The body as one call per input, each with all the questions."""
    return [{**body, "inputs": [inp]} for inp in body["inputs"]]


def merged(found: list[Keyed]) -> Keyed:
    out: Keyed = {}
    for part in found:
        out.update(part)
    return out


def shuffled(body: dict, seed: int = 5) -> dict:
    """The body with its inputs and each query's combinations in another order."""
    rng = random.Random(seed)
    inputs = list(body["inputs"])
    rng.shuffle(inputs)
    queries = []
    for q in body["scoring"]["queries"]:
        combos = list(q.get("combinations") or [{}])
        rng.shuffle(combos)
        queries.append({**q, "combinations": combos})
    return {**body, "inputs": inputs, "scoring": {**body["scoring"], "queries": queries}}


def alone(body: dict, limit: int | None) -> list[dict]:
    """Bodies of one input and one question (one combination) each, the first ``limit`` of them."""
    singles = [
        {**body, "inputs": [inp], "scoring": {**body["scoring"], "queries": [{**q, "combinations": [combo]}]}}
        for inp in body["inputs"]
        for q in body["scoring"]["queries"]
        for combo in (q.get("combinations") or [{}])
    ]
    return singles[:limit]


def compositions(engine: Engine, j1: dict, j2: dict | None, max_alone: int | None) -> tuple[Keyed, dict, dict]:
    """J1 in one call (the reference), J1 in the other compositions, and J2's own (reference, as 256 calls)."""
    (whole,) = score_keyed(engine, [j1])
    found = {}
    singles = alone(j1, max_alone)
    found[f"alone ({len(singles)} calls, one after another)"] = merged(
        [score_keyed(engine, [single])[0] for single in singles]
    )
    found["with its input's other questions"] = merged([score_keyed(engine, [b])[0] for b in one_per_input(j1)])
    found[f"as {len(j1['inputs'])} concurrent calls of one input"] = merged(score_keyed(engine, one_per_input(j1)))
    (found["J1 shuffled (inputs and combinations)"],) = score_keyed(engine, [shuffled(j1)])
    cold = engine.new_loop(share_passes=engine.batch_invariant, floor_cache=0)
    (found["J1 with the floor cache off"],) = score_keyed(engine, [j1], loop=cold)
    j2_found = {}
    if j2 is not None:
        found["J1 in the same passes as J2"] = score_keyed(engine, [j1, j2])[0]
        (j2_whole,) = score_keyed(engine, [j2])
        calls = one_per_input(j2)
        j2_found = {"whole": j2_whole, f"as {len(calls)} concurrent calls": merged(score_keyed(engine, calls))}
    return whole, found, j2_found


def invariance_lines(engine: Engine, j1: dict, j2: dict | None, max_alone: int | None) -> list[tuple[str, str]]:
    """(job, text) lines: how many questions each composition compared, and how many differ in any bit."""
    started = time.perf_counter()
    whole, found, j2_found = compositions(engine, j1, j2, max_alone)
    seconds = time.perf_counter() - started
    shared = "calls share passes" if engine.loop.share_passes else "each call runs in passes of its own"
    lines = [
        ("J1", f"invariance: reference = all of J1 in one call ({len(whole)} questions); {shared}; {seconds:.0f} s")
    ]
    for name, keys in found.items():
        reference = {k: whole[k] for k in keys} if name.startswith("alone") else whole
        n, differ = differing_bits(reference, keys)
        lines.append(("J1", f"invariance, {name}: {n} questions compared, {differ} differ in any bit"))
    if j2_found:
        reference = j2_found.pop("whole")
        for name, keys in j2_found.items():
            n, differ = differing_bits(reference, keys)
            lines.append(("J2", f"invariance vs J2 in one call, {name}: {n} questions compared, {differ} differ"))
    return lines
