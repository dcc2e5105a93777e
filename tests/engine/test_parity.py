"""Parity runs (engine spec B.15, api spec §10): the metrics, the whole-prompt path, the files, ``spinf-serve parity``
and its verdict (bit for bit on the recorded platform, within a bound elsewhere), and the parity gate on the CPU:
the recorded tiny-model reference matches a fresh run."""

from __future__ import annotations

import gzip
import json
import math
import os
from pathlib import Path

import numpy as np
import pytest
from tokenizers import Tokenizer, models, trainers

from spinf.cli import main
from spinf.engine.parity import (
    build_jobs,
    check_reference,
    compare,
    fill,
    read_fixture,
    run_parity,
    with_values,
    write_fixture,
)
from spinf.engine.tokenizer import TextTokenizer
from spinf.engine.verdict import (
    CROSS_PLATFORM_BOUNDS,
    describe_platform,
    engine_platform,
    engine_reference_name,
    judge,
)
from spinf.errors import ConfigError
from tests.engine.oracle import Oracle

TINY_REFERENCE = Path(__file__).resolve().parents[2] / "fixtures" / "parity" / "tiny-cpu-fp32.json.gz"
TEXT = "The harbour authority raised its fees for cargo ships on Tuesday, after a long dispute with the carriers."
CELLS = [
    {"template": "{X}\n\n{F} is likely to{CTX}", "phrase": "Shipping costs", "pair": ["rise", "fall"]},
    {"template": "{X}\n\n{F} is likely to{CTX}", "phrase": "The port", "pair": ["skyrocket", "stagnate"]},
    {"template": "{X}\n\nAfter this, {F} will{CTX}", "phrase": "trade", "pair": ["grow", "shrink"]},
]


def small_fixture() -> dict:
    jobs = [
        {"id": "a", "text": TEXT, "cells": CELLS},
        {"id": "b", "text": "Bread prices went up again.", "cells": CELLS[:2]},
    ]
    return {"day": "2026-11-29", "reference": None, "jobs": jobs}


@pytest.fixture
def tiny_env(monkeypatch, tiny_cache):
    """``spinf-serve parity`` on the tiny model from the environment, and nothing of the calling shell's SPINF_*."""
    for name in [name for name in os.environ if name.startswith("SPINF_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("SPINF_MODEL", "tiny")
    monkeypatch.setenv("SPINF_CACHE_DIRS", str(tiny_cache))


def run(capsys, *argv: str) -> tuple[int, dict | None, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, json.loads(out) if out else None, err


# -- metrics --------------------------------------------------------------------------------------------------------


def test_compare_on_hand_made_cells():
    ours = [(-1.0, -2.0), (-3.0, -1.0), (-0.5, -0.25)]
    theirs = [(-1.0, -2.0), (-3.0, -1.5), (-0.5, -0.75)]
    got = compare(ours, theirs)
    raw_ours, raw_theirs = [1.0, -2.0, -0.25], [1.0, -1.5, 0.25]
    assert got == {
        "n": 3,
        "lp_max_abs": 0.5,
        "lp_mean_abs": pytest.approx(1 / 6),
        "lp_exact_share": pytest.approx(4 / 6),
        "raw_max_abs": 0.5,
        "raw_mean_abs": pytest.approx(1 / 3),
        "raw_corr": pytest.approx(np.corrcoef(raw_ours, raw_theirs)[0, 1]),
        "raw_sign_agree": pytest.approx(2 / 3),
    }


def test_exact_share_counts_only_bit_identical_values():
    ours = [(-1.0, -2.0), (-0.1, -0.2)]
    nudged = [(math.nextafter(-1.0, 0.0), -2.0), (-0.1, -0.2)]
    assert compare(ours, ours)["lp_exact_share"] == 1.0
    got = compare(ours, nudged)
    assert got["lp_exact_share"] == 0.75 and 0 < got["lp_max_abs"] < 1e-15 and got["raw_sign_agree"] == 1.0


def test_correlation_is_null_where_undefined_and_sign_zero_is_its_own_sign():
    got = compare([(-1.0, -1.0), (-2.0, -2.0)], [(-1.0, -2.0), (-2.0, -2.0)])
    assert got["raw_corr"] is None  # our raw values are constant
    assert got["raw_sign_agree"] == 0.5  # 0 against 1 disagrees, 0 against 0 agrees
    with pytest.raises(ValueError, match=r"^compare needs the same non-zero number of cells, got 1 and 2$"):
        compare([(-1.0, -2.0)], [(-1.0, -2.0), (-1.0, -2.0)])


# -- the whole-prompt path ------------------------------------------------------------------------------------------


def test_fill_substitutes_in_one_pass():
    assert fill("{X}|{F}|{CTX}|{Y}", "text with {F}", "phrase") == "text with {F}|phrase||{Y}"


def test_fill_reads_escaped_braces_as_str_format_does():
    """The reference engine fills a template with ``str.format``: ``{{`` and ``}}`` are one brace there."""
    template = "{{{X}}} {{F}} }}{F}{{ {CTX}"
    assert fill(template, "t {{x}}", "p") == template.format(X="t {{x}}", F="p", CTX="") == "{t {{x}}} {F} }p{ "


def test_jobs_share_the_longest_common_prefix_and_every_prompt_keeps_a_token(tiny_engine):
    tk = tiny_engine.tokenizer
    fixture = small_fixture()
    fixture["jobs"].append({"id": "same", "text": "Rain.", "cells": [CELLS[0], CELLS[0]]})
    jobs, reads = build_jobs(tk, fixture)
    for job, spec in zip(jobs, fixture["jobs"], strict=True):
        prompts = [tk.bos + tk.tok(fill(c["template"], spec["text"], c["phrase"])) for c in spec["cells"]]
        assert all(p[: len(job.prefix)] == job.prefix for p in prompts)
        assert len(job.prefix) + 1 == min(map(len, prompts)) or len({p[len(job.prefix)] for p in prompts}) > 1
    assert len(jobs[2].prefix) == len(tk.bos + tk.tok(fill(CELLS[0]["template"], "Rain.", "Shipping costs"))) - 1
    assert [len(cell) for cell in reads[0]] == [2, 2, 2]


def test_whole_prompt_values_match_a_plain_forward_pass(tiny_engine):
    """Each cell's two log-probs against transformers run on the whole prompt, option tokens by the chain rule."""
    oracle = Oracle(tiny_engine.folder)
    fixture = small_fixture()
    report = run_parity(tiny_engine.loop, fixture, passes=1, record="r")
    assert report["reference"] is None and report["passes"][0]["parity"] is None
    recorded = report["recorded"]
    assert any(len(oracle.tok(" " + w)) > 1 for cell in CELLS for w in cell["pair"])  # the chain rule is exercised
    for job in recorded["jobs"]:
        for cell in job["cells"]:
            prompt = oracle.bos + oracle.tok(fill(cell["template"], job["text"], cell["phrase"]))
            expected = [oracle.lp(prompt, oracle.tok(" " + word)) for word in cell["pair"]]
            assert [cell["lp_pos"], cell["lp_neg"]] == pytest.approx(expected, abs=1e-4)


def test_an_option_that_merges_with_its_prompt_is_refused():
    """The tiny tokenizer splits before every space; a tokenizer without that rule merges "to " with " rise"."""
    plain = Tokenizer(models.BPE())
    plain.train_from_iterator(
        ["Rain is likely to  rise. "] * 50, trainers.BpeTrainer(vocab_size=60, show_progress=False)
    )
    fixture = {"jobs": [{"id": "a", "text": "Rain", "cells": [{**CELLS[0], "template": "{X} is likely to "}]}]}
    with pytest.raises(ConfigError, match=r"^jobs\.0\.cells\.0: option ' rise' merges with the end of its prompt"):
        build_jobs(TextTokenizer(plain), fixture)


# -- files ----------------------------------------------------------------------------------------------------------


def test_a_fixture_round_trips_plain_and_gzip(tmp_path):
    fixture = with_values(small_fixture(), [(-1.5, -2.25)] * 5, "hand-made")
    for name in ("f.json", "f.json.gz"):
        write_fixture(fixture, tmp_path / name)
        assert read_fixture(tmp_path / name) == fixture
    assert (tmp_path / "f.json.gz").read_bytes()[:2] == b"\x1f\x8b"


def test_recorded_values_stay_with_their_job_when_jobs_share_cell_objects():
    fixture = small_fixture()  # jobs a and b share the dicts of CELLS[:2]
    recorded = with_values(fixture, [(-1.0, -1.5), (-2.0, -2.5), (-3.0, -3.5), (-4.0, -4.5), (-5.0, -5.5)], "r")
    assert [c["lp_pos"] for job in recorded["jobs"] for c in job["cells"]] == [-1.0, -2.0, -3.0, -4.0, -5.0]
    assert "lp_pos" not in CELLS[0]


def test_the_built_in_fixture_has_the_published_shape():
    fixture = read_fixture(None)
    assert len(fixture["jobs"]) == 24 and {len(job["cells"]) for job in fixture["jobs"]} == {56}
    assert fixture["reference"] is None and all(c["lp_pos"] is None for j in fixture["jobs"] for c in j["cells"])


BAD_SHAPES = [
    ([], 'expected {"day", "reference", "jobs": [...]} with at least one job'),
    ({"jobs": [{"id": "a", "text": "t", "cells": []}]}, "expected at least one cell (every job's cells are empty)"),
    ({"jobs": [{"id": "a", "text": "t", "cells": None}]}, "jobs.0.cells: expected a list"),
    ({"jobs": [{"id": 1, "text": "t", "cells": CELLS}]}, 'jobs.0: expected {"id": string, "text": string, "cells"'),
    ({"jobs": [{"id": "a", "text": "t", "cells": [{**CELLS[0], "pair": ["rise"]}]}]}, "pair: expected two"),
    ({"jobs": [{"id": "a", "text": "t", "cells": [{**CELLS[0], "lp_pos": -1.0}]}]}, "expected both or neither"),
    ({"jobs": [{"id": "a", "text": "t", "cells": [{**CELLS[0], "lp_pos": "x", "lp_neg": 1}]}]}, "numbers or null"),
    (
        {"jobs": [{"id": "a", "text": "t", "cells": [{**CELLS[0], "lp_pos": -1.0, "lp_neg": -2.0}, CELLS[1]]}]},
        "some cells have lp_pos/lp_neg values and others do not",
    ),
    ({"platform": "cpu", "jobs": [{"id": "a", "text": "t", "cells": CELLS}]}, "platform: expected an object of"),
    ({"platform": {"isa": 2}, "jobs": [{"id": "a", "text": "t", "cells": CELLS}]}, "platform: expected an object"),
]


@pytest.mark.parametrize(("data", "expected"), BAD_SHAPES)
def test_a_fixture_of_the_wrong_shape_is_refused(tmp_path, data, expected):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ConfigError, match=r"^--fixture \S+bad\.json: ") as caught:
        read_fixture(path)
    assert expected in str(caught.value)


def test_a_reference_must_hold_the_fixture_s_cells():
    fixture = small_fixture()
    recorded = with_values(fixture, [(-1.0, -2.0)] * 5, "r")
    check_reference(fixture, recorded)
    with pytest.raises(ConfigError, match=r"^--reference: a reference needs lp_pos and lp_neg in every cell$"):
        check_reference(fixture, fixture)
    other = json.loads(json.dumps(recorded))
    other["jobs"][1]["cells"][0]["phrase"] = "Cake prices"
    with pytest.raises(ConfigError, match=r"^--reference: jobs\.1\.cells\.0 differs from the fixture's"):
        check_reference(fixture, other)
    with pytest.raises(ConfigError, match=r"^--reference: 1 jobs, the fixture has 2$"):
        check_reference(fixture, {**recorded, "jobs": recorded["jobs"][:1]})


# -- spinf-serve parity ---------------------------------------------------------------------------------------------


@pytest.fixture
def recorded(tmp_path, capsys, monkeypatch, tiny_env) -> tuple[Path, dict]:
    """The small fixture as ``SPINF_FIXTURE`` and a reference of it recorded by ``spinf-serve parity --record``,
    with the report of the recording run."""
    fixture = tmp_path / "fixture.json"
    write_fixture(small_fixture(), fixture)
    monkeypatch.setenv("SPINF_FIXTURE", str(fixture))  # the default of --fixture
    path = tmp_path / "ref.json.gz"
    code, report, err = run(capsys, "parity", "--device", "cpu", "--passes", "1", "--record", str(path))
    assert (code, err) == (0, "")
    return path, report


def test_a_recorded_reference_names_its_run_and_its_platform(recorded, tmp_path, tiny_engine):
    path, report = recorded
    fixture = {"day": "2026-11-29", "reference": None, "jobs": 2, "cells": 5, "path": str(tmp_path / "fixture.json")}
    assert report["fixture"] == fixture
    assert report["reference"] is None and report["passes"][0]["parity"] is None and report["check"] is None
    assert report["engine"]["model"] == "spinf/tiny-gemma4" and report["boot"]["load_s"] > 0
    written = read_fixture(path)
    platform = engine_platform(tiny_engine.info(), "cpu")
    assert written["platform"] == report["platform"] == platform
    assert platform["device"] == "cpu" and platform["isa"] and platform["cpu"] and platform["torch"]
    assert report["recorded"] == {"path": str(path), "reference": written["reference"]}
    assert written["reference"] == engine_reference_name(tiny_engine.info(), platform)
    assert "quant fp32; lm-head fp32; device cpu " + platform["isa"] in written["reference"]


def test_on_the_recorded_platform_the_reference_must_match_bit_for_bit(recorded, tmp_path, capsys):
    path, _ = recorded
    code, report, err = run(capsys, "parity", "--device", "cpu", "--reference", str(path))
    here = describe_platform(report["platform"])
    assert (code, err) == (
        0,
        f"spinf-serve: parity: {path} was recorded on this platform ({here}): every log-prob must match bit for bit\n"
        "spinf-serve: parity: passed: bit for bit over 5 cells\n",
    )
    assert [p["parity"]["lp_exact_share"] for p in report["passes"]] == [1.0, 1.0]
    platform = read_fixture(path)["platform"]
    assert report["reference"] == {
        "source": "reference",
        "reference": read_fixture(path)["reference"],
        "platform": platform,
        "path": str(path),
    }
    assert report["check"] == {"platform": "same", "rule": "bit for bit", "bound": None, "passed": True}
    speed = report["passes"][1]
    assert speed["tokens"] > 0 and speed["wall_s"] >= speed["gpu_busy_s"] > 0 and speed["tok_s"] > 0

    perturbed = read_fixture(path)
    cell = perturbed["jobs"][1]["cells"][0]
    cell["lp_pos"] = math.nextafter(cell["lp_pos"], 0.0)  # one ulp: far inside any bound, still not bit for bit
    write_fixture(perturbed, tmp_path / "perturbed.json")
    code, report, err = run(
        capsys, "parity", "--device", "cpu", "--passes", "1", "--reference", f"{tmp_path}/perturbed.json"
    )
    assert code == 1 and err.splitlines()[1] == (
        "spinf-serve: parity: failed: lp_exact_share 0.900000 < 1 on the last pass (lp_max_abs "
        f"{report['passes'][0]['parity']['lp_max_abs']:.3g} over 5 cells)"
    )
    assert report["check"] == {"platform": "same", "rule": "bit for bit", "bound": None, "passed": False}


def elsewhere(path: Path, shift: float, tmp_path: Path) -> tuple[Path, dict]:
    """``path``'s reference as if recorded on an AVX2 machine of another make, every value moved by ``shift``."""
    reference = read_fixture(path)
    reference["platform"] = {**reference["platform"], "cpu": "Other CPU 9000", "isa": "AVX2"}
    for job in reference["jobs"]:
        for cell in job["cells"]:
            cell["lp_pos"] += shift
            cell["lp_neg"] -= shift
    moved = tmp_path / f"elsewhere-{shift}.json"
    write_fixture(reference, moved)
    return moved, reference["platform"]


def test_on_another_platform_a_difference_within_the_bound_passes(recorded, tmp_path, capsys):
    moved, theirs = elsewhere(recorded[0], 3e-5, tmp_path)
    code, report, err = run(capsys, "parity", "--device", "cpu", "--passes", "1", "--reference", str(moved))
    here = describe_platform(report["platform"])
    assert theirs["isa"] == "AVX2" and "AVX2 (Other CPU 9000)" in describe_platform(theirs)
    worst = report["passes"][0]["parity"]["lp_max_abs"]
    assert worst == pytest.approx(3e-5, rel=1e-6)
    assert (code, err) == (
        0,
        f"spinf-serve: parity: {moved} was recorded on {describe_platform(theirs)}; this run is on {here}: bitwise "
        "parity is not expected across platforms\n"
        f"spinf-serve: parity: passed: lp_max_abs {worst:.3g} <= 0.0001, the bound for quant fp32 across platforms "
        "(over 5 cells; lp_exact_share 0.000000)\n",
    )
    assert report["check"] == {"platform": "different", "rule": "lp_max_abs <= bound", "bound": 1e-4, "passed": True}


def test_on_another_platform_a_difference_over_the_bound_fails(recorded, tmp_path, capsys):
    moved, theirs = elsewhere(recorded[0], 2e-4, tmp_path)
    code, report, err = run(capsys, "parity", "--device", "cpu", "--passes", "1", "--reference", str(moved))
    worst = report["passes"][0]["parity"]["lp_max_abs"]
    assert code == 1 and err.count("\n") == 2
    assert f"was recorded on {describe_platform(theirs)}; this run is on " in err.splitlines()[0]
    assert err.splitlines()[1] == (
        f"spinf-serve: parity: failed: lp_max_abs {worst:.3g} > 0.0001, the bound for quant fp32 across platforms "
        "(over 5 cells; lp_exact_share 0.000000)"
    )
    assert report["check"]["passed"] is False


def test_a_reference_that_records_no_platform_is_taken_for_another_one(recorded, tmp_path, capsys):
    """Files recorded before the platform was: the tiny reference in fixtures/ is one; it must still load."""
    old = read_fixture(recorded[0])
    del old["platform"]
    write_fixture(old, tmp_path / "old.json")
    code, report, err = run(
        capsys, "parity", "--device", "cpu", "--passes", "1", "--reference", f"{tmp_path}/old.json"
    )
    isa = report["platform"]["isa"]
    assert code == 0 and err.splitlines() == [
        f"spinf-serve: parity: {tmp_path}/old.json records no platform (an older file; its name says cpu {isa}, torch "
        f"{report['platform']['torch']}), so it is taken for another one; this run is on "
        f"{describe_platform(report['platform'])}: bitwise parity is not expected across platforms",
        "spinf-serve: parity: passed: lp_max_abs 0 <= 0.0001, the bound for quant fp32 across platforms (over 5 "
        "cells; lp_exact_share 1.000000)",
    ]
    assert report["reference"]["platform"] is None and report["check"]["platform"] == "unknown"


def as_the_reference_engine_writes(data: dict, path: Path) -> None:
    """``data`` written as spinf-serve 0.1.1's ``--record`` writes a reference: gzip whatever the name, compact JSON,
    no platform, and its own kind of reference string."""
    written = {key: value for key, value in data.items() if key != "platform"}
    written["reference"] = "spinf-serve quant fp32, lm head fp32, aligned True"
    with gzip.open(path, "wt") as file:
        json.dump(written, file)


@pytest.fixture
def from_the_reference_engine(tmp_path, capsys, monkeypatch, tiny_env) -> Path:
    """The small fixture with a job of no cells (the reference engine skips such a job) as ``SPINF_FIXTURE``, and
    this run's values of it in a file written as the reference engine writes one."""
    fixture = small_fixture()
    fixture["jobs"].insert(1, {"id": "none", "text": "Nothing is asked of this one.", "cells": []})
    write_fixture(fixture, tmp_path / "fixture.json")
    monkeypatch.setenv("SPINF_FIXTURE", str(tmp_path / "fixture.json"))
    ours = tmp_path / "ours.json"
    code, report, err = run(capsys, "parity", "--device", "cpu", "--passes", "1", "--record", str(ours))
    assert (code, err) == (0, "") and (report["fixture"]["jobs"], report["fixture"]["cells"]) == (3, 5)
    path = tmp_path / "reference-0.1.1.json"  # not .gz: it is gzip all the same
    as_the_reference_engine_writes(read_fixture(ours), path)
    return path


def test_a_file_the_reference_engine_wrote_is_read_and_held_to_the_bound(from_the_reference_engine, capsys):
    path = from_the_reference_engine
    assert path.read_bytes()[:2] == b"\x1f\x8b" and "platform" not in read_fixture(path)
    code, report, err = run(capsys, "parity", "--device", "cpu", "--passes", "1", "--reference", str(path))
    assert code == 0 and err.splitlines() == [
        f"spinf-serve: parity: {path} records no platform, so it is taken for another one; this run is on "
        f"{describe_platform(report['platform'])}: bitwise parity is not expected across platforms",
        "spinf-serve: parity: passed: lp_max_abs 0 <= 0.0001, the bound for quant fp32 across platforms (over 5 "
        "cells; lp_exact_share 1.000000)",
    ]
    assert report["check"] == {"platform": "unknown", "rule": "lp_max_abs <= bound", "bound": 1e-4, "passed": True}


def test_without_a_platform_a_scheme_without_a_bound_passes_bit_for_bit_and_says_what_differs_otherwise(
    from_the_reference_engine, tmp_path, capsys, monkeypatch
):
    """fp8s and bf16 have no cross-platform bound and do not run on the CPU: the tiny model's fp32 stands in for
    them with its bound taken away. Regression: such a reference failed even bit for bit."""
    monkeypatch.delitem(CROSS_PLATFORM_BOUNDS, "fp32")
    path = from_the_reference_engine
    code, report, err = run(capsys, "parity", "--device", "cpu", "--passes", "1", "--reference", str(path))
    assert (code, err.splitlines()[1]) == (
        0,
        "spinf-serve: parity: passed: bit for bit over 5 cells, though quant fp32 is not expected to match across "
        "platforms",
    )
    assert err.splitlines()[0].endswith(": bitwise parity is not expected across platforms")
    assert report["check"] == {"platform": "unknown", "rule": "bit for bit", "bound": None, "passed": True}

    nudged = read_fixture(path)
    cell = nudged["jobs"][2]["cells"][1]
    cell["lp_neg"] = math.nextafter(cell["lp_neg"], 0.0)  # one ulp, in the job after the empty one
    as_the_reference_engine_writes(nudged, tmp_path / "nudged.json")
    code, report, err = run(
        capsys, "parity", "--device", "cpu", "--passes", "1", "--reference", f"{tmp_path}/nudged.json"
    )
    got = report["passes"][0]["parity"]
    assert 0 < got["lp_max_abs"] < 1e-12 and got["raw_sign_agree"] == 1.0
    assert code == 1 and err.splitlines()[1] == (
        f"spinf-serve: parity: failed: 1 of 10 log-probs differ (lp_max_abs {got['lp_max_abs']:.3g}, lp_mean_abs "
        f"{got['lp_mean_abs']:.3g}, raw_max_abs {got['raw_max_abs']:.3g}, raw_sign_agree 1.000000), and no bound "
        "is stated for quant fp32 across platforms, so only bit for bit passes; record a reference on this "
        "platform with --record"
    )
    assert report["check"] == {"platform": "unknown", "rule": "bit for bit", "bound": None, "passed": False}


def test_the_tiny_reference_records_the_platform_its_name_gives():
    """Recorded before references recorded their platform; the block was added later from its name (the CPU's model
    was not noted, so it is null: no run counts as on the very same platform)."""
    reference = read_fixture(TINY_REFERENCE)
    assert reference["platform"] == {"device": "cpu", "cpu": None, "isa": "AVX512", "torch": "2.13.0+cpu"}
    assert reference["reference"].endswith("; device cpu AVX512; torch 2.13.0+cpu")
    assert describe_platform(reference["platform"]) == "cpu AVX512 (CPU model not recorded), torch 2.13.0+cpu"


PLATFORM = {"device": "cuda", "gpu": "NVIDIA H200", "capability": "9.0", "torch": "2.13.0+cu130", "cuda": "13.0"}
METRICS = {
    "n": 1344,
    "lp_max_abs": 2e-3,
    "lp_mean_abs": 4e-4,
    "lp_exact_share": 0.25,
    "raw_max_abs": 3e-3,
    "raw_mean_abs": 5e-4,
    "raw_corr": 0.999999,
    "raw_sign_agree": 0.999256,
}
IDENTICAL = {**METRICS, **dict.fromkeys(("lp_max_abs", "lp_mean_abs", "raw_max_abs", "raw_mean_abs"), 0.0)}
IDENTICAL |= {"lp_exact_share": 1.0, "raw_corr": 1.0, "raw_sign_agree": 1.0}


def test_a_scheme_without_a_bound_fails_across_platforms_and_says_what_differs():
    reference = {"platform": {**PLATFORM, "gpu": "NVIDIA H100 80GB HBM3"}, "jobs": []}
    assert "fp8s" not in CROSS_PLATFORM_BOUNDS
    verdict = judge(METRICS, reference, "ref.json.gz", PLATFORM, "fp8s")
    assert (verdict.platform, verdict.bound, verdict.passed) == ("different", None, False)
    assert verdict.lines == (
        "ref.json.gz was recorded on NVIDIA H100 80GB HBM3 (capability 9.0, CUDA 13.0), torch 2.13.0+cu130; this "
        "run is on NVIDIA H200 (capability 9.0, CUDA 13.0), torch 2.13.0+cu130: bitwise parity is not expected "
        "across platforms",
        "failed: 2016 of 2688 log-probs differ (lp_max_abs 0.002, lp_mean_abs 0.0004, raw_max_abs 0.003, "
        "raw_sign_agree 0.999256), and no bound is stated for quant fp8s across platforms, so only bit for bit "
        "passes; record a reference on this platform with --record",
    )
    assert verdict.as_json() == {"platform": "different", "rule": "bit for bit", "bound": None, "passed": False}


@pytest.mark.parametrize("scheme", ["fp8s", "fp8", "bf16", "w8a16"])
def test_a_reference_without_a_platform_passes_bit_identical_values_under_any_scheme(scheme):
    """Regression: every reference recorded without a platform (older files, and all of the reference engine's)
    failed under fp8s, even bit for bit, since no cross-platform bound is stated for it."""
    reference = {"reference": "spinf-serve quant fp8s, lm head fp32, aligned True", "jobs": []}
    verdict = judge(IDENTICAL, reference, "ref.json.gz", PLATFORM, scheme)
    assert (verdict.platform, verdict.bound, verdict.passed) == ("unknown", None, True)
    assert verdict.lines == (
        "ref.json.gz records no platform, so it is taken for another one; this run is on NVIDIA H200 (capability "
        "9.0, CUDA 13.0), torch 2.13.0+cu130: bitwise parity is not expected across platforms",
        f"passed: bit for bit over 1344 cells, though quant {scheme} is not expected to match across platforms",
    )
    assert verdict.as_json() == {"platform": "unknown", "rule": "bit for bit", "bound": None, "passed": True}
    elsewhere = judge(IDENTICAL, {"platform": {**PLATFORM, "torch": "2.11"}}, "r", PLATFORM, scheme)
    assert (elsewhere.platform, elsewhere.passed) == ("different", True)
    failed = judge(METRICS, reference, "ref.json.gz", PLATFORM, scheme)
    assert not failed.passed and failed.lines[1].startswith("failed: 2016 of 2688 log-probs differ (lp_max_abs")
    assert failed.lines[0] == verdict.lines[0]
    same = judge({**METRICS, "lp_exact_share": 1.0, "lp_max_abs": 0.0}, {"platform": PLATFORM}, "r", PLATFORM, "fp8s")
    assert same.passed and same.lines[1] == "passed: bit for bit over 1344 cells"


def test_a_nan_difference_fails_the_bound():
    verdict = judge(
        {**METRICS, "lp_max_abs": math.nan}, {"platform": {**PLATFORM, "torch": "2.11"}}, "r", PLATFORM, "fp32"
    )
    assert not verdict.passed and verdict.lines[1].startswith("failed: lp_max_abs nan > 0.0001")


def test_without_a_reference_the_fixture_s_own_values_are_reported_not_enforced(tmp_path, capsys, tiny_env):
    nudged = tmp_path / "nudged.json"
    write_fixture(with_values(small_fixture(), [(-1.0, -2.0)] * 5, "made up"), nudged)
    code, report, err = run(capsys, "parity", "--device", "cpu", "--passes", "1", "--fixture", str(nudged))
    assert (code, err) == (0, "")
    assert report["reference"] == {"source": "fixture", "reference": "made up", "platform": None, "path": str(nudged)}
    assert report["check"] is None
    assert report["passes"][0]["parity"]["lp_exact_share"] == 0.0


def test_bad_files_are_one_line_and_status_2(tmp_path, capsys, tiny_env):
    fixture = tmp_path / "fixture.json"
    write_fixture(small_fixture(), fixture)
    (tmp_path / "text.json").write_text("not json")
    (tmp_path / "shape.json").write_text('{"jobs": []}')
    other = small_fixture()
    other["jobs"][0]["text"] = "Another text."
    write_fixture(with_values(other, [(-1.0, -2.0)] * 5, "r"), tmp_path / "other.json")
    cases = [
        (["--fixture", f"{tmp_path}/missing.json"], "missing.json: cannot read it (No such file or directory)"),
        (["--fixture", f"{tmp_path}/text.json"], "text.json: not a (gzip-compressed) JSON file: "),
        (["--fixture", f"{tmp_path}/shape.json"], 'shape.json: expected {"day", "reference", "jobs": [...]}'),
        (["--fixture", str(fixture), "--reference", f"{tmp_path}/other.json"], "jobs.0 ('a') differs from"),
        (["--fixture", str(fixture), "--reference", str(fixture)], "a reference needs lp_pos and lp_neg"),
    ]
    for argv, expected in cases:
        code, out, err = run(capsys, "parity", "--device", "cpu", *argv)
        assert (code, out) == (2, None) and err.count("\n") == 1 and expected in err, err
        assert err.startswith("spinf-serve: --")


# -- the parity gate on the CPU -------------------------------------------------------------------------------------


def test_the_tiny_cpu_reference_matches_a_fresh_run_bit_for_bit(tiny_engine):
    """Bit for bit on the platform it was recorded on; elsewhere, such as torch 2.11 on another CPU, about 94% of the
    values differ in the last bits. The fixture records no platform (an older file, like those `spinf-serve parity`
    takes for another platform), and its name says only the torch build and the instruction set: a CPU of the same
    instruction set can still round otherwise (one with AMX, reporting AVX512, differed in 95% of the
    values by at most 3e-5). So, as the command does, it is judged by the cross-platform bound unless it records
    the very platform of this run."""
    fixture, reference = read_fixture(None), read_fixture(TINY_REFERENCE, flag="--reference")
    check_reference(fixture, reference)
    assert reference["reference"].startswith(f"spinf/tiny-gemma4@{tiny_engine.revision}; quant fp32; lm-head fp32")
    picked = [0, 13, 23]  # a subset keeps the test quick; the packing differs from the recorded run's
    subset = [{**data, "jobs": [data["jobs"][j] for j in picked]} for data in (fixture, reference)]
    report = run_parity(tiny_engine.loop, subset[0], subset[1], passes=1)
    parity = report["passes"][0]["parity"]
    assert parity["n"] == 3 * 56 and parity["raw_sign_agree"] == 1.0
    info = tiny_engine.info()
    here = engine_platform(info, "cpu")
    if reference.get("platform") == here and reference["reference"] == engine_reference_name(info, here):
        assert (parity["lp_exact_share"], parity["lp_max_abs"]) == (1.0, 0.0)
    else:
        assert parity["lp_max_abs"] < 1e-4, reference["reference"]


def test_a_recorded_runs_name_says_the_lm_head_it_ran():
    from spinf.engine.verdict import engine_reference_name

    info = {"model": "m", "revision": "r", "quant": "fp8s", "torch": "2.11", "lm_head": "bf16"}
    platform = {"device": "cuda", "gpu": "NVIDIA H200", "capability": "9.0"}
    assert "; lm-head bf16; " in engine_reference_name(info, platform)
    assert "; lm-head f32out; " in engine_reference_name({**info, "lm_head": "f32out"}, platform)
