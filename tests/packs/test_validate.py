"""Validation of a pack file (packs spec §8): every problem of the table, produced by one edit of a valid pack and
reported at its JSON path; the early exits; drafts (§1.11); and no crash on any JSON value."""

from __future__ import annotations

import copy
import json
import random
from pathlib import Path

import pytest

from spinf.packs.packfile import parse_pack
from spinf.packs.validate import check_pack
from tests.packs.mutate import mutate

FIXTURES = Path(__file__).parent / "fixtures"
TONE = json.loads((FIXTURES / "tone.json").read_text())
MINIMAL = json.loads((FIXTURES / "minimal.json").read_text())


def problems_of(pack: object, *, draft: bool = False) -> list[tuple[str, str]]:
    return [(p.path, p.message) for p in check_pack(pack, draft=draft).items]


def edited(change) -> dict:
    pack = copy.deepcopy(TONE)
    change(pack)
    return pack


def q(i):
    return lambda p: p["scoring"]["queries"][i]


def read(i, **fields):
    return lambda p: p["reads"][i].update(fields)


def cat(name, **fields):
    return lambda p: p["categories"][name].update(fields)


def micro(**fields):
    return lambda p: p["decision"]["micro_layer"].update(fields)


def _all_grid(p):
    p["scoring"]["queries"][2].update(combinations="all", values={"F": ["a person", "a group"]})
    p["reads"][2]["F"] = "a robot"


# (check, the edit, the path, a fragment of the message)
CASES = [
    ("pack", lambda p: p.update(pack="Acme/tone"), "pack", "<namespace>/<name>"),
    ("pack two slashes", lambda p: p.update(pack="acme/to/ne"), "pack", "<namespace>/<name>"),
    ("version", lambda p: p.update(version="1_0"), "version", "letters, digits, '.', '+', '-'"),
    ("model", lambda p: p.update(model=""), "model", "model id the pack was calibrated on"),
    ("media without text", lambda p: p.update(media=["image"]), "media", "'text' plus any of"),
    ("media unknown", lambda p: p.update(media=["text", "smell"]), "media", "'text' plus any of"),
    ("answers", lambda p: p.update(answers="probability"), "answers", "'p', 'logprob'"),
    ("parameters shape", lambda p: p.update(parameters=[]), "parameters", "{name: {label, description?"),
    ("parameter named X", lambda p: p.update(parameters={"X": {}}), "parameters.X", "content placeholder"),
    ("parameter label", lambda p: p.update(parameters={"b": {"label": 3}}), "parameters.b.label", "'b' must be a"),
    ("parameter required", lambda p: p.update(parameters={"b": {"required": 1}}), "parameters.b.required", "boolean"),
    ("contexts shape", lambda p: p.update(contexts={}), "contexts", "at least one context"),
    ("contexts not strings", lambda p: p.update(contexts={"a": 1}), "contexts", "name -> template string"),
    ("no {X}", lambda p: p["contexts"].update(chat="hello"), "contexts.chat", "exactly one {X}"),
    ("two {X}", lambda p: p["contexts"].update(chat="{X} {X}"), "contexts.chat", "exactly one {X}"),
    ("unknown placeholder", lambda p: p["contexts"].update(chat="{X} {brand} {a b}"), "contexts.chat", "{brand}"),
    ("scoring shape", lambda p: p.update(scoring=[]), "scoring", "{queries, empty_floor?, case_insensitive?}"),
    ("scoring flag", lambda p: p["scoring"].update(empty_floor="yes"), "scoring.empty_floor", "true or false"),
    ("scoring case", lambda p: p["scoring"].update(case_insensitive=0), "scoring.case_insensitive", "true or false"),
    ("scoring extra", lambda p: p["scoring"].update(packs=[], x=1), "scoring", "unknown keys: 'packs', 'x'"),
    ("queries empty", lambda p: p["scoring"].update(queries=[]), "scoring.queries", "non-empty list"),
    ("query not an object", lambda p: p["scoring"]["queries"].append(3), "scoring.queries.3", "query 3 must be an"),
    ("query schema id", lambda p: q(0)(p).update(id=5), "scoring.queries.0.id", "query 0 fails the query schema"),
    ("query schema options", lambda p: q(1)(p).update(options=[" a", 2]), "scoring.queries.1.options.1", "schema"),
    ("query schema missing", lambda p: q(0)(p).pop("template"), "scoring.queries.0.template", "is required"),
    ("not scored", lambda p: q(0)(p).update(template="Answer:"), "scoring.queries.0", "('rude') must be a scored"),
    ("one option", lambda p: q(0)(p).update(options=[" yes"]), "scoring.queries.0", "at least two options"),
    ("group set", lambda p: q(0)(p).update(group="g"), "scoring.queries.0.group", "('rude') must not set 'group'"),
    ("duplicate query id", lambda p: q(1)(p).update(id="rude"), "scoring.queries.1.id", "query 1 repeats"),
    ("reads shape", lambda p: p.update(reads=[]), "reads", "non-empty list"),
    ("read without id", lambda p: p["reads"][0].pop("id"), "reads.0", "read 0 must be an object with an id"),
    ("read not an object", lambda p: p["reads"].append(None), "reads.4", "read 4 must be an object with an id"),
    ("duplicate read id", read(1, id="r_rude"), "reads.1.id", "read 1 repeats the read id 'r_rude'"),
    ("unknown query", read(0, query="nope"), "reads.0.query", "'nope' is not in scoring.queries"),
    ("F not a combination", read(2, F="a robot"), "reads.2.F", "not the F of any combination"),
    ("F missing on combinations", lambda p: p["reads"][2].pop("F"), "reads.2.F", "not the F of any combination"),
    ("F not a value", _all_grid, "reads.2.F", "not one of the query's values.F"),
    ("F on a plain query", read(0, F="x"), "reads.0.F", "has no combinations, so the read takes no F"),
    ("pair sign", read(0, sign=2), "reads.0", "sign 1 or -1"),
    ("pair sign bool", read(0, sign=True), "reads.0", "sign 1 or -1"),
    ("pair options", read(1, kind="pair"), "reads.1", "two options (it has 3)"),
    ("option index", read(0, kind="option", option=2, mu=0.1), "reads.0", "option index below 2"),
    ("option mu", read(0, kind="option", option=1, mu=[0.1]), "reads.0", "a number as mu"),
    ("set mu", read(1, mu=[1.0, 2.0]), "reads.1.mu", "a list of 3 numbers"),
    ("any mu", read(1, kind="any", mu=None), "reads.1.mu", "one mu per option"),
    ("set unsafe all", read(1, unsafe=[0, 1, 2]), "reads.1.unsafe", "below 3, not all of them"),
    ("set unsafe range", read(1, unsafe=[3]), "reads.1.unsafe", "below 3"),
    ("set unsafe empty", read(1, unsafe=[]), "reads.1.unsafe", "below 3"),
    ("kind", read(0, kind="both"), "reads.0.kind", "'pair', 'option', 'any', 'set'"),
    ("sd zero", read(0, sd=0), "reads.0", "sd > 0"),
    ("mean bool", read(0, mean=True), "reads.0", "must be numbers"),
    ("read category", read(0, category="nope"), "reads.0.category", "'nope' is not in categories"),
    ("view", read(0, view=3), "reads.0.view", "view must be a string"),
    ("categories shape", lambda p: p.update(categories=[]), "categories", "at least one category"),
    ("category not an object", lambda p: p["categories"].update(targeted=1), "categories.targeted", "an object"),
    ("platt", cat("rudeness", platt=[1.0]), "categories.rudeness.platt", "[a, b]"),
    ("threshold", cat("rudeness", threshold=1.5), "categories.rudeness.threshold", "between 0 and 1"),
    ("unfed", lambda p: p["categories"].update(x={"platt": [1, 0]}), "categories.x", "no read feeds"),
    (
        "quantiles order",
        cat("rudeness", normal_quantiles={"levels": [0.5, 0.9], "values": [0.3, 0.2]}),
        "categories.rudeness.normal_quantiles",
        "non-decreasing",
    ),
    (
        "quantiles lengths",
        cat("rudeness", normal_quantiles={"levels": [0.5, 0.9], "values": [0.1, 0.2, 0.3]}),
        "categories.rudeness.normal_quantiles",
        "same length",
    ),
    ("aggregate", cat("rudeness", aggregate="mean"), "categories.rudeness.aggregate", "'views' or absent"),
    ("requires itself", cat("rudeness", requires=["rudeness"]), "categories.rudeness.requires", "other existing"),
    ("requires unknown", cat("rudeness", requires=["nope"]), "categories.rudeness.requires", "other existing"),
    ("decides", cat("rudeness", decides="no"), "categories.rudeness.decides", "true or false"),
    ("fallback", lambda p: p["decision"].update(fallback="micro_layer"), "decision.fallback", "'max' or"),
    ("max missing", lambda p: p["decision"].pop("max"), "decision.max", "{threshold} with a number"),
    ("max threshold", lambda p: p["decision"].update(max={"threshold": "a"}), "decision.max", "{threshold}"),
    ("critical", lambda p: p["decision"].update(critical=["nope"]), "decision.critical", "existing category ids"),
    ("no micro-layer", lambda p: p["decision"].pop("micro_layer"), "decision.micro_layer", "needed by mode"),
    ("inputs shape", micro(inputs=[]), "decision.micro_layer.inputs", "non-empty list of 'c:<category>'"),
    ("bad input", micro(inputs=["c:rudeness", "r:nope", "x"]), "decision.micro_layer.inputs.1", "'r:nope' is not"),
    ("weights size", micro(weights="AAAAAAAAAAAAAAAAAAAAAA=="), "decision.micro_layer.weights", "hold 4 floats"),
    ("weights hidden", micro(hidden=2), "decision.micro_layer.weights", "n*h + 2h + 2 = 12"),
    ("weights base64", micro(weights="not base64!"), "decision.micro_layer.weights", "standard base64"),
    ("weights bytes", micro(weights="AAA="), "decision.micro_layer.weights", "multiple of 4"),
    ("hidden", micro(hidden=-1), "decision.micro_layer.hidden", "0 or more"),
    ("dtype", micro(dtype="float16"), "decision.micro_layer.dtype", "not 'float16'"),
    ("lock format", micro(lock="md5:abc"), "decision.micro_layer.lock", "'sha256:' and 64 lowercase hex"),
]


@pytest.mark.parametrize(("check", "change", "path", "fragment"), CASES, ids=[case[0] for case in CASES])
def test_each_problem_is_reported_at_its_path(check, change, path, fragment):
    found = problems_of(edited(change))
    assert any(where == path and fragment in message for where, message in found), found


@pytest.mark.parametrize("pack", [TONE, MINIMAL], ids=["tone", "minimal"])
def test_the_spec_packs_validate_with_no_problem(pack):
    assert problems_of(pack) == []


def test_a_file_that_is_not_an_object_stops_there():
    assert problems_of([TONE]) == [("", "a pack file is a JSON object")]


def test_missing_top_level_fields_are_each_reported_in_order_and_nothing_else():
    pack = {"scoring": 1, "reads": "bad", "pack": "BAD"}
    assert [path for path, _ in problems_of(pack)] == ["version", "model", "contexts", "categories", "decision"]


def test_an_invalid_decision_mode_stops_the_decision_checks():
    pack = edited(lambda p: p["decision"].update(mode="vote", critical=["nope"], fallback="x"))
    assert problems_of(pack) == [
        ("decision", "decision must be an object whose mode is one of 'max', 'per_category', 'micro_layer'")
    ]


def test_several_problems_are_all_collected():
    pack = edited(lambda p: (p.update(version="_"), read(0, sd=-1)(p), micro(dtype="x")(p)))
    assert [path for path, _ in problems_of(pack)] == ["version", "reads.0", "decision.micro_layer.dtype"]


def test_unknown_queries_are_not_reported_when_no_query_parses():
    pack = edited(lambda p: p["scoring"].update(queries=[1, {"id": 2}]))
    paths = [path for path, _ in problems_of(pack)]
    assert not any(path.endswith(".query") for path in paths)
    assert "scoring.queries.0" in paths and "scoring.queries.1.id" in paths


def test_a_read_of_an_unknown_query_skips_its_other_checks():
    pack = edited(read(0, query="nope", sd=-1, kind="x"))
    assert [path for path, _ in problems_of(pack) if path.startswith("reads.0")] == ["reads.0.query"]


def test_a_micro_layer_is_optional_outside_its_mode_and_an_empty_one_is_none():
    pack = edited(lambda p: p["decision"].update(mode="per_category", micro_layer={}))
    assert problems_of(pack) == []
    assert parse_pack(pack).pack.decision.modes == ("max", "per_category")


def test_a_hidden_layer_with_the_right_float_count_validates():
    # 3 inputs, 2 hidden units: 3*2 + 2*2 + 2 = 12 floats = 48 bytes.
    pack = edited(micro(hidden=2, weights="A" * 64))
    assert problems_of(pack) == []


def _draft() -> dict:
    pack = copy.deepcopy(TONE)
    for r in pack["reads"]:
        r.pop("mean"), r.pop("sd"), r.pop("mu", None)
    for spec in pack["categories"].values():
        spec.pop("platt")
    pack["decision"].pop("micro_layer")
    pack["decision"]["max"] = {}
    return pack


def test_a_draft_may_lack_the_fitted_constants():
    draft = _draft()
    assert problems_of(draft, draft=True) == []
    paths = [path for path, _ in problems_of(draft)]
    assert {"reads.0", "reads.1.mu", "categories.rudeness.platt", "decision.max", "decision.micro_layer"} <= set(paths)


def test_a_draft_still_checks_the_constants_it_has_and_everything_else():
    draft = _draft()
    draft["reads"][0]["sd"] = 0
    draft["categories"]["rudeness"]["platt"] = [1]
    draft["reads"][1]["kind"] = "nope"
    paths = [path for path, _ in problems_of(draft, draft=True)]
    assert paths == ["reads.0", "reads.1.kind", "categories.rudeness.platt"]


def test_no_json_value_makes_validation_crash():
    rng = random.Random(13)
    for _ in range(3000):
        pack = TONE
        for _ in range(rng.randint(1, 4)):
            pack = mutate(pack, rng)
        parsed = parse_pack(pack)
        assert (parsed.pack is None) == bool(parsed.problems)
        assert all(isinstance(p.path, str) and p.message for p in parsed.problems)
