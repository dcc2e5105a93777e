"""A seeded generator of valid packs, results and call settings for the evaluator's conformance test (packs.md §11).

Each case is drawn from ``random.Random(seed)``, so a failing seed replays alone. The packs cover every read kind and
``sign``, combinations by list and by ``"all"``, views (and, rarely, a ``views`` category with no viewed read),
``requires`` chains in both orders, ``decides: false``, null and integer thresholds, ``normal_quantiles`` with ties,
linear and hidden micro-layers with matching and broken locks, both answer forms, zero probabilities (clipping),
tied scores, repeated combinations, foreign queries and, rarely, a missing answer. Call settings cover each mode,
``threshold``, ``thresholds`` with numbers, nulls and (rarely) an unknown category, and ``critical`` given, ``[]``
(none), absent, repeated and unknown.
"""

from __future__ import annotations

import base64
import math
import random
import struct

from spinf_client.packs import lock_of


def _float32s(values: list[float]) -> str:
    return base64.b64encode(struct.pack(f"<{len(values)}f", *values)).decode("ascii")


def _query(rng: random.Random, index: int) -> dict:
    n = rng.choice([2, 2, 3, 4])
    query = {"id": f"q{index}", "template": "\n\nQ about {F}?{?}", "options": [f" o{j}" for j in range(n)]}
    shape = rng.choice(["plain", "plain", "list", "all"])
    values = [f"f{j}" for j in range(rng.randint(1, 3))]
    if shape == "plain":
        query["template"] = "\n\nQ?{?}"
    elif shape == "list":
        query["combinations"] = [{"F": value} for value in values]
    else:
        query["combinations"] = "all"
        query["values"] = {"F": values}
    return query


def _f_values(query: dict) -> list[str | None]:
    combinations = query.get("combinations")
    if combinations is None:
        return [None]
    if combinations == "all":
        return list(query["values"]["F"])
    return [combination["F"] for combination in combinations]


def _read(rng: random.Random, index: int, query: dict, category: str) -> dict:
    n = len(query["options"])
    read = {"id": f"r{index}", "query": query["id"]}
    f_value = rng.choice(_f_values(query))
    if f_value is not None:
        read["F"] = f_value
    kinds = ["option", "any", "set"] + (["pair", "pair"] if n == 2 else [])
    kind = rng.choice(kinds)
    read["kind"] = kind
    if kind == "pair" and rng.random() < 0.6:
        read["sign"] = rng.choice([1, -1])
    elif kind == "option":
        read["option"] = rng.randrange(n)
        read["mu"] = rng.uniform(-3, 1)
    elif kind in ("any", "set"):
        read["mu"] = [rng.uniform(-3, 1) for _ in range(n)]
    if kind == "set":
        unsafe = rng.sample(range(n), rng.randint(1, n - 1))
        read["unsafe"] = unsafe + (unsafe[:1] if rng.random() < 0.2 else [])
    read.update({"mean": rng.uniform(-3, 3), "sd": rng.uniform(0.3, 3), "category": category})
    if rng.random() < 0.4:
        read["view"] = rng.choice(["v1", "v2", "v3", ""])
    return read


def _threshold(rng: random.Random):
    return rng.choice([None, rng.random(), rng.random(), rng.uniform(0, 0.2), 0, 1])


def _quantiles(rng: random.Random) -> dict:
    size = rng.randint(2, 5)
    values = sorted(rng.random() for _ in range(size))
    if rng.random() < 0.4:
        values[1] = values[0]
    levels = sorted(rng.random() for _ in range(size))
    return {"levels": levels, "values": values}


def _category(rng: random.Random, name: str, names: list[str], reads: list[dict]) -> dict:
    spec = {"label": name.title(), "platt": [rng.uniform(-0.5, 2.5), rng.uniform(-4, 1)]}
    threshold = _threshold(rng)
    if threshold is not None or rng.random() < 0.5:
        spec["threshold"] = threshold
    if rng.random() < 0.5:
        spec["normal_quantiles"] = _quantiles(rng)
    viewed = any(read.get("view") for read in reads if read["category"] == name)
    if rng.random() < 0.3 and (viewed or rng.random() < 0.05):
        spec["aggregate"] = "views"
    others = [other for other in names if other != name]
    if others and rng.random() < 0.35:
        spec["requires"] = rng.sample(others, rng.randint(1, len(others)))
    if rng.random() < 0.25:
        spec["decides"] = rng.random() < 0.3
    return spec


def _micro_layer(rng: random.Random, categories: list[str], reads: list[dict]) -> dict:
    names = [f"c:{name}" for name in categories] + [f"r:{read['id']}" for read in reads]
    inputs = rng.sample(names, rng.randint(1, min(len(names), 5)))
    hidden = rng.choice([0, 0, 1, 2, 3])
    n = len(inputs)
    count = n + 2 if hidden == 0 else n * hidden + 2 * hidden + 2
    weights = [rng.uniform(-1.5, 1.5) for _ in range(count)]
    micro = {"inputs": inputs, "weights": _float32s(weights)}
    if hidden or rng.random() < 0.3:
        micro["hidden"] = hidden
    return micro


def _decision(rng: random.Random, categories: list[str], reads: list[dict]) -> dict:
    decision: dict = {}
    if rng.random() < 0.7:
        decision["max"] = {"threshold": rng.choice([rng.random(), rng.random(), 0, 1])}
    if rng.random() < 0.75:
        decision["micro_layer"] = _micro_layer(rng, categories, reads)
    fallbacks = ["per_category"] + (["max"] if "max" in decision else [])
    if rng.random() < 0.7:
        decision["fallback"] = rng.choice(fallbacks)
    modes = ["per_category"] + [mode for mode in ("max", "micro_layer") if mode in decision]
    decision["mode"] = rng.choice(modes)
    if rng.random() < 0.7:
        decision["critical"] = rng.sample(categories, rng.randint(0, len(categories)))
    return decision


def random_pack(rng: random.Random) -> dict:
    """A valid pack; its micro-layer lock (when it has one) matches about four times in five."""
    queries = [_query(rng, index) for index in range(rng.randint(1, 4))]
    categories = [f"cat{index}" for index in range(rng.randint(1, 4))]
    num_reads = rng.randint(len(categories), len(categories) + 5)
    owners = categories + [rng.choice(categories) for _ in range(num_reads - len(categories))]
    rng.shuffle(owners)
    reads = [_read(rng, index, rng.choice(queries), owner) for index, owner in enumerate(owners)]
    pack = {
        "pack": "test/random",
        "version": f"1.0.{rng.randrange(100)}",
        "model": "spinf/gemma-4-12b-fp8",
        "contexts": {"plain": "{X}"},
        "scoring": {"queries": queries},
        "reads": reads,
        "categories": {name: _category(rng, name, categories, reads) for name in categories},
        "decision": _decision(rng, categories, reads),
    }
    if rng.random() < 0.1:  # every score equal: ties in max go to the first deciding category
        b = rng.uniform(-2, 2)
        for spec in pack["categories"].values():
            spec["platt"] = [0.0, b]
    if rng.random() < 0.6:
        pack["answers"] = rng.choice(["p", "logprob"])
    micro = pack["decision"].get("micro_layer")
    if micro is not None:
        micro["lock"] = lock_of(pack) if rng.random() < 0.8 else "sha256:" + "0" * 64
    return pack


def _options(rng: random.Random, texts: list[str]) -> list[dict]:
    logprobs = [rng.choice([rng.uniform(-4, 0), rng.uniform(-25, -8)]) for _ in texts]
    top = max(logprobs)
    total = top + math.log(sum(math.exp(logprob - top) for logprob in logprobs))
    return [
        {"text": text, "logprob": round(logprob - total, 6), "p": round(math.exp(logprob - total), 6)}
        for text, logprob in zip(texts, logprobs, strict=True)
    ]


def random_result(rng: random.Random, pack: dict) -> dict:
    """One input's result for the pack's queries, in the API's shape, plus a foreign query, sometimes a repeated
    combination (the later one wins) and rarely a dropped one (an answer missing for a read)."""
    queries = []
    for query in pack["scoring"]["queries"] + [{"id": "foreign", "options": [" a", " b"]}]:
        combinations = [
            {"values": {} if value is None else {"F": value}, "options": _options(rng, query["options"])}
            for value in _f_values(query)
        ]
        if rng.random() < 0.1:
            combinations.append(dict(rng.choice(combinations), options=_options(rng, query["options"])))
        if rng.random() < 0.02:
            combinations.pop(rng.randrange(len(combinations)))
        queries.append({"id": query["id"], "combinations": combinations})
    return {"input_id": "0", "queries": queries}


def random_calls(rng: random.Random, pack: dict) -> list[dict]:
    """The call settings to try on one pack: the default, each offered mode, and a few drawn overrides."""
    decision = pack["decision"]
    categories = list(pack["categories"])
    modes = ["per_category"] + [mode for mode in ("max", "micro_layer") if decision.get(mode)]
    calls = [{}] + [{"mode": mode} for mode in modes]
    for _ in range(3):
        call: dict = {}
        if rng.random() < 0.7:
            call["mode"] = rng.choice(modes)
        if rng.random() < 0.5:
            call["threshold"] = rng.choice([rng.random(), rng.uniform(-2, 2), 0, 1])
        if rng.random() < 0.5:
            chosen = rng.sample(categories, rng.randint(1, len(categories)))
            call["thresholds"] = {name: rng.choice([None, rng.random(), rng.uniform(0, 0.1), 1]) for name in chosen}
            if rng.random() < 0.03:
                call["thresholds"]["nope"] = 0.5
        if rng.random() < 0.5:
            listed = rng.sample(categories, rng.randint(0, len(categories)))
            call["critical"] = listed + rng.choice([[], [], ["nope"], listed[:1]])
        calls.append(call)
    return calls
