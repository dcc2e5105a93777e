"""Reading and parsing a pack file (packs spec §1, §2, §9.1): the parsed objects, defaults, the lock comparison,
and the refusals before parsing (too large, not JSON)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from spinf.packs.packfile import MAX_FILE_BYTES, parse_pack, read_pack_file

FIXTURES = Path(__file__).parent / "fixtures"


def test_the_minimal_pack_parses_with_its_defaults():
    parsed = read_pack_file(FIXTURES / "minimal.json")
    assert parsed.problems == ()
    pack = parsed.pack
    assert (pack.id, pack.version, pack.namespace, pack.group) == (
        "example/off-topic",
        "1.0.0",
        "example",
        "example/off-topic@1.0.0",
    )
    assert pack.media == ("text",) and pack.answers == "p" and pack.parameters == ()
    assert pack.default_context == "support" and pack.prompts == 1
    assert (pack.empty_floor, pack.case_insensitive) == (True, False)
    assert pack.decision.modes == ("per_category",) and pack.decision.fallback == "per_category"
    assert pack.decision.micro_layer is None and pack.lock_matches is None
    [category] = pack.categories
    assert (category.label, category.platt, category.threshold, category.decides) == (
        "Off topic",
        (1.5, -1.0),
        0.7,
        True,
    )
    [read] = pack.reads
    assert (read.kind, read.sign, read.F, read.mean, read.sd) == ("pair", 1, None, 0.4, 2.2)


def test_the_test_vector_pack_parses_its_micro_layer_and_lock():
    pack = read_pack_file(FIXTURES / "tone.json").pack
    assert pack.decision.modes == ("max", "per_category", "micro_layer")
    assert pack.prompts == 4 and [q.prompts for q in pack.queries] == [1, 1, 2]
    layer = pack.decision.micro_layer
    assert layer.weights == (0.800000011920929, 0.5, 0.30000001192092896, -1.0, 0.25)
    assert layer.threshold == 0.25 and layer.hidden == 0
    assert pack.lock_matches is True
    assert pack.decision.critical == ("rudeness",) and pack.decision.max_threshold == 0.5
    assert pack.categories[1].threshold is None and pack.categories[0].normal_quantiles == (
        (0.5, 0.9, 0.99),
        (0.05, 0.2, 0.6),
    )
    assert pack.reads[1].mu == (-0.2, -2.5, -3.0) and pack.reads[1].unsafe == (1, 2)
    assert pack.queries[2].spec is pack.raw["scoring"]["queries"][2]


def test_an_edited_constant_breaks_the_lock_but_not_the_file():
    raw = json.loads((FIXTURES / "tone.json").read_text())
    raw["reads"][0]["mean"] = -1.9
    parsed = parse_pack(raw)
    assert parsed.problems == () and parsed.pack.lock_matches is False


def test_parameters_keep_their_declaration_order_and_defaults():
    raw = json.loads((FIXTURES / "minimal.json").read_text())
    raw["parameters"] = {"brand": {"label": "Brand"}, "tone": {"required": False, "default": 1.0}}
    raw["contexts"] = {"support": "About {brand} ({tone}):\n{X}"}
    [brand, tone] = parse_pack(raw).pack.parameters
    assert (brand.name, brand.label, brand.required, brand.default) == ("brand", "Brand", True, None)
    assert (tone.name, tone.required, tone.default) == ("tone", False, 1.0)


def test_a_file_that_is_not_json_is_refused_with_the_parsers_reason(tmp_path):
    for text in ['{"pack": ', '{"a": NaN}', "\ufeff{}"]:
        path = tmp_path / "bad.json"
        path.write_text(text, encoding="utf-8")
        [problem] = read_pack_file(path).problems
        assert problem.path == "" and problem.message.startswith("the file is not JSON: ")
    path.write_bytes(b'{"pack": "\xff"}')
    assert "not UTF-8" in read_pack_file(path).problems[0].message


def test_a_file_over_16_mib_is_refused_before_it_is_parsed(tmp_path):
    path = tmp_path / "big.json"
    with open(path, "wb") as f:
        f.truncate(MAX_FILE_BYTES + 1)  # sparse: NUL bytes, which would also fail as JSON
    [problem] = read_pack_file(path).problems
    assert problem.message.startswith("the file is larger than 16 MiB")
    os.truncate(path, MAX_FILE_BYTES)
    assert "not JSON" in read_pack_file(path).problems[0].message


def test_a_missing_file_is_a_problem_not_an_exception(tmp_path):
    [problem] = read_pack_file(tmp_path / "none.json").problems
    assert problem.message.startswith("the file cannot be read")
