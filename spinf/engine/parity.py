"""Parity runs (engine spec B.15): a fixture's cells scored on the whole-prompt path and compared with a reference.

A fixture is JSON, optionally gzip: ``{"day", "reference", "jobs": [{"id", "text", "cells": [{"template", "phrase",
"pair": [pos, neg], "lp_pos", "lp_neg"}]}]}``. A cell's prompt is its template with ``{X}`` = the job's text, ``{F}``
= the phrase and ``{CTX}`` = empty (and ``{{``/``}}`` a brace, as Python's ``str.format``, which the reference
engine fills them with); its options are ``" " + pos`` and ``" " + neg``; ``lp_pos``/``lp_neg`` are their full
log-probs after the prompt. A fixture holds values in every cell or in none (``null``); a job may have no cells (the
reference engine skips such a job), but a fixture has at least one. A reference is a fixture with values, recorded
by a run, whose ``reference`` string names the model, scheme, LM-head mode and device, and whose ``platform`` object
names what else its bits depend on (`engine_platform`; ``null`` or absent in files recorded before it existed, and
in every file the reference engine writes, which count as recorded elsewhere). The reference engine's files (always
gzip whatever their name, compact JSON, no ``platform``) are read as they are.

This module owns reading and checking those files, the whole-prompt path (every prompt tokenized whole with BOS;
the longest common token prefix of a job's prompts is its shared prefix and each prompt keeps at least one token
of its own as its branch; an option's log-prob is the float64 sum of its tokens' log-probs, the chain rule), the
passes, the metrics and the recorded reference; the verdict against a reference is `spinf.engine.verdict`'s. Its
jobs reach the device through the engine loop (`spinf.engine.loop`), as every caller's do, as caller-built jobs
(`RawJobs`).
"""

from __future__ import annotations

import gzip
import json
import math
import re
import statistics
import time
from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING

import attrs

from spinf.engine.loop import RawJobs
from spinf.engine.query_tokens import ENDING_CHARS
from spinf.engine.tokenizer import TextTokenizer
from spinf.engine.trie import Job, add_prompt
from spinf.engine.verdict import Verdict, engine_platform, engine_reference_name, judge
from spinf.errors import ConfigError

if TYPE_CHECKING:
    from spinf.engine.engine import Engine
    from spinf.engine.loop import EngineLoop

BUILTIN = "built-in"  # the fixture path reported when the package's own fixture is used
_BUILTIN_FILE = ("data", "parity-fixture.json.gz")
_GZIP_MAGIC = b"\x1f\x8b"
_PLACEHOLDER = re.compile(r"\{(X|F|CTX)\}|\{\{|\}\}")  # str.format's names and escaped braces
_CELL_KEYS = ("template", "phrase", "pair")


LpPair = tuple[float, float]  # (lp_pos, lp_neg) of one cell


def read_fixture(path: str | Path | None, *, flag: str = "--fixture") -> dict:
    """A checked fixture (or reference) file, JSON or gzip; ``None`` reads the built-in fixture.

    Every problem is a one-line `ConfigError` that names ``flag`` and the file.
    """
    name = f"{flag} {path or BUILTIN}"
    try:
        raw = (resources.files("spinf").joinpath(*_BUILTIN_FILE) if path is None else Path(path)).read_bytes()
    except OSError as exc:
        raise ConfigError(f"{name}: cannot read it ({exc.strerror or exc})") from exc
    try:
        data = json.loads(gzip.decompress(raw) if raw[:2] == _GZIP_MAGIC else raw)
    except (OSError, EOFError, ValueError) as exc:
        raise ConfigError(f"{name}: not a (gzip-compressed) JSON file: {exc}") from exc
    problem = _fixture_problem(data)
    if problem:
        raise ConfigError(f"{name}: {problem}")
    return data


def _fixture_problem(data: object) -> str | None:
    if not isinstance(data, dict) or not isinstance(data.get("jobs"), list) or not data["jobs"]:
        return 'expected {"day", "reference", "jobs": [...]} with at least one job'
    if not isinstance(data.get("reference"), str | None):
        return "reference: expected a string or null"
    recorded_on = data.get("platform")
    if recorded_on is not None and not (
        isinstance(recorded_on, dict) and all(isinstance(v, str | None) for v in recorded_on.values())
    ):
        return "platform: expected an object of strings, or null"
    for j, job in enumerate(data["jobs"]):
        if not (isinstance(job, dict) and isinstance(job.get("id"), str) and isinstance(job.get("text"), str)):
            return f'jobs.{j}: expected {{"id": string, "text": string, "cells": [...]}}'
        if not isinstance(job.get("cells"), list):
            return f"jobs.{j}.cells: expected a list"
        for c, cell in enumerate(job["cells"]):
            problem = _cell_problem(cell)
            if problem:
                return f"jobs.{j}.cells.{c}: {problem}"
    if not any(job["cells"] for job in data["jobs"]):
        return "expected at least one cell (every job's cells are empty)"
    if len({has_values(cell) for job in data["jobs"] for cell in job["cells"]}) > 1:
        return "some cells have lp_pos/lp_neg values and others do not"
    return None


def _cell_problem(cell: object) -> str | None:
    if not isinstance(cell, dict) or not all(isinstance(cell.get(key), str) for key in ("template", "phrase")):
        return 'expected {"template": string, "phrase": string, "pair": [pos, neg], "lp_pos", "lp_neg"}'
    pair = cell.get("pair")
    if not isinstance(pair, list) or len(pair) != 2 or not all(isinstance(w, str) and w for w in pair):
        return "pair: expected two non-empty strings"
    values = [cell.get("lp_pos"), cell.get("lp_neg")]
    if not all(v is None or (isinstance(v, int | float) and not isinstance(v, bool)) for v in values):
        return "lp_pos, lp_neg: expected numbers or null"
    if (values[0] is None) != (values[1] is None):
        return "lp_pos, lp_neg: expected both or neither"
    return None


def has_values(cell_or_fixture: Mapping) -> bool:
    """Does a cell (or every cell of a fixture) hold ``lp_pos``/``lp_neg``?"""
    if "jobs" in cell_or_fixture:
        return all(has_values(cell) for job in cell_or_fixture["jobs"] for cell in job["cells"])
    return cell_or_fixture.get("lp_pos") is not None


def check_reference(fixture: Mapping, reference: Mapping, name: str = "--reference") -> None:
    """`ConfigError` unless ``reference`` holds values for exactly the fixture's jobs and cells, in order."""
    if not has_values(reference):
        raise ConfigError(f"{name}: a reference needs lp_pos and lp_neg in every cell")
    if len(reference["jobs"]) != len(fixture["jobs"]):
        raise ConfigError(f"{name}: {len(reference['jobs'])} jobs, the fixture has {len(fixture['jobs'])}")
    for j, (ours, theirs) in enumerate(zip(fixture["jobs"], reference["jobs"], strict=True)):
        if (ours["id"], ours["text"]) != (theirs["id"], theirs["text"]):
            raise ConfigError(f"{name}: jobs.{j} ({theirs['id']!r}) differs from the fixture's ({ours['id']!r})")
        if len(theirs["cells"]) != len(ours["cells"]):
            raise ConfigError(
                f"{name}: jobs.{j} has {len(theirs['cells'])} cells, the fixture's has {len(ours['cells'])}"
            )
        for c, (a, b) in enumerate(zip(ours["cells"], theirs["cells"], strict=True)):
            if any(a[key] != b[key] for key in _CELL_KEYS):
                raise ConfigError(f"{name}: jobs.{j}.cells.{c} differs from the fixture's (template, phrase or pair)")


def fill(template: str, text: str, phrase: str) -> str:
    """A cell's prompt: ``{X}`` = the text, ``{F}`` = the phrase, ``{CTX}`` = empty, ``{{`` and ``}}`` one brace
    (what the reference engine's ``template.format(X=..., F=..., CTX="")`` makes of them), in one pass."""
    values = {"X": text, "F": phrase, "CTX": ""}
    return _PLACEHOLDER.sub(lambda found: values[found[1]] if found[1] else found[0][0], template)


def _shared_prefix_len(prompts: list[tuple[int, ...]]) -> int:
    """The longest common prefix of ``prompts``, short enough that each keeps at least one token of its own."""
    low, high = min(prompts), max(prompts)  # the common prefix of a set is that of its lexicographic extremes
    n, limit = 0, min(map(len, prompts)) - 1
    while n < limit and low[n] == high[n]:
        n += 1
    return n


def _option_tokens(tk: TextTokenizer, prompt: str, option: str, where: str) -> tuple[int, ...]:
    """``tok(option)``, checked to join the prompt's end at a token boundary (the boundary rule of A.4)."""
    tokens = tk.tok(option)
    ending = prompt[-ENDING_CHARS:]
    if tk.tok(ending + option) != tk.tok(ending) + tokens:
        raise ConfigError(f"{where}: option {option!r} merges with the end of its prompt when tokenized")
    return tokens


def build_jobs(tk: TextTokenizer, fixture: Mapping) -> tuple[list[Job], list[list[list[list[tuple[int, int]]]]]]:
    """One `Job` per fixture job with cells on the whole-prompt path, and per job, per cell, the reads of its two
    options (a job without cells has nothing to run, and no values in `cell_values`)."""
    jobs, reads = [], []
    for j, spec in enumerate(fixture["jobs"]):
        if not spec["cells"]:
            continue
        prompts = [fill(cell["template"], spec["text"], cell["phrase"]) for cell in spec["cells"]]
        tokens = [tk.bos + t for t in tk.tok_many(prompts)]
        if not all(tokens):
            raise ConfigError(f"jobs.{j}: a prompt with no tokens (empty text and template, and no BOS)")
        keep = _shared_prefix_len(tokens)
        job = Job(tokens[0][:keep])
        per_cell = []
        for c, (cell, prompt, prompt_tokens) in enumerate(zip(spec["cells"], prompts, tokens, strict=True)):
            options = [_option_tokens(tk, prompt, " " + word, f"jobs.{j}.cells.{c}") for word in cell["pair"]]
            per_cell.append(add_prompt(job, prompt_tokens[keep:], options))
        jobs.append(job)
        reads.append(per_cell)
    return jobs, reads


def compare(ours: list[LpPair], theirs: list[LpPair]) -> dict:
    """The parity metrics of B.15 over matching cells: log-prob differences, and those of ``raw = pos - neg``."""
    if len(ours) != len(theirs) or not ours:
        raise ValueError(f"compare needs the same non-zero number of cells, got {len(ours)} and {len(theirs)}")
    lp_diffs = [abs(a - b) for mine, ref in zip(ours, theirs, strict=True) for a, b in zip(mine, ref, strict=True)]
    exact = sum(a == b for mine, ref in zip(ours, theirs, strict=True) for a, b in zip(mine, ref, strict=True))
    raw_ours = [pos - neg for pos, neg in ours]
    raw_theirs = [pos - neg for pos, neg in theirs]
    raw_diffs = [abs(a - b) for a, b in zip(raw_ours, raw_theirs, strict=True)]
    signs = sum(_sign(a) == _sign(b) for a, b in zip(raw_ours, raw_theirs, strict=True))
    return {
        "n": len(ours),
        "lp_max_abs": max(lp_diffs),
        "lp_mean_abs": math.fsum(lp_diffs) / len(lp_diffs),
        "lp_exact_share": exact / len(lp_diffs),
        "raw_max_abs": max(raw_diffs),
        "raw_mean_abs": math.fsum(raw_diffs) / len(raw_diffs),
        "raw_corr": _correlation(raw_ours, raw_theirs),
        "raw_sign_agree": signs / len(ours),
    }


def _sign(x: float) -> int:
    return (x > 0) - (x < 0)


def _correlation(xs: list[float], ys: list[float]) -> float | None:
    """Pearson's r; ``None`` (JSON null) where it is undefined: fewer than two cells or a constant side."""
    try:
        return statistics.correlation(xs, ys)
    except statistics.StatisticsError:
        return None


def cell_values(fixture: Mapping) -> list[LpPair]:
    """Every cell's ``(lp_pos, lp_neg)``, jobs in order."""
    return [(cell["lp_pos"], cell["lp_neg"]) for job in fixture["jobs"] for cell in job["cells"]]


def with_values(fixture: Mapping, lps: list[LpPair], reference: str, platform: Mapping | None = None) -> dict:
    """A copy of ``fixture`` holding ``lps`` (in `cell_values` order) under the ``reference`` name, recorded on
    ``platform`` (`engine_platform`; None: not known, as for a model built in memory).

    Every cell is a new dict: a fixture built in memory may share one cell object between jobs.
    """
    if len(lps) != sum(len(job["cells"]) for job in fixture["jobs"]):
        raise ValueError(f"{len(lps)} values for a fixture of another size")
    values = iter(lps)
    jobs = [
        # zip stops at the job's last cell without drawing from ``values``: each job takes its own share
        {
            **job,
            "cells": [{**cell, "lp_pos": p, "lp_neg": n} for cell, (p, n) in zip(job["cells"], values, strict=False)],
        }
        for job in fixture["jobs"]
    ]
    return {**fixture, "reference": reference, "platform": dict(platform) if platform else None, "jobs": jobs}


def write_fixture(data: Mapping, path: str | Path) -> None:
    """Write a fixture or reference atomically; gzip when the name ends in ``.gz`` (with no timestamp inside)."""
    path = Path(path)
    text = (json.dumps(data, indent=1, ensure_ascii=False) + "\n").encode()
    payload = gzip.compress(text, mtime=0) if path.suffix == ".gz" else text
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    partial.write_bytes(payload)
    partial.replace(path)


def run_parity(
    loop: EngineLoop,
    fixture: Mapping,
    reference: Mapping | None = None,
    *,
    passes: int = 2,
    record: str | None = None,
    engine: Mapping | None = None,
    platform: Mapping | None = None,
) -> dict:
    """Score ``fixture`` ``passes`` times and compare each pass with ``reference``.

    Without a reference, the fixture's own values are the reference when it has them; otherwise each pass reports
    speed only (``parity`` null). ``reference`` must match the fixture (`check_reference`). With ``record`` (a
    `reference_name`), the report's ``recorded`` is the fixture holding the last pass's values under that name and
    ``platform`` (`engine_platform`, or None when unknown).
    """
    if passes < 1:
        raise ValueError(f"passes must be at least 1, got {passes}")
    started = time.perf_counter()
    jobs, reads = build_jobs(loop.tokenizer, fixture)
    prepare_s = time.perf_counter() - started
    against = reference if reference is not None else (fixture if has_values(fixture) else None)
    expected = cell_values(against) if against is not None else None
    runs = []
    for _ in range(passes):
        speed, lps = _one_pass(loop, jobs, reads)
        runs.append({**speed, "parity": compare(lps, expected) if expected is not None else None})
    report = {
        "boot": {"prepare_s": round(prepare_s, 4)},
        "engine": dict(engine) if engine is not None else {"device": str(loop.scorer.device)},
        "fixture": {
            "day": fixture.get("day"),
            "reference": fixture.get("reference"),
            "jobs": len(fixture["jobs"]),
            "cells": sum(len(job["cells"]) for job in fixture["jobs"]),
        },
        "reference": None,
        "passes": runs,
    }
    if against is not None:
        source = "fixture" if reference is None else "reference"
        report["reference"] = {
            "source": source,
            "reference": against.get("reference"),
            "platform": against.get("platform"),
        }
    if record is not None:
        report["recorded"] = with_values(fixture, lps, record, platform)
    return report


def _one_pass(loop: EngineLoop, jobs: list[Job], reads: list) -> tuple[dict, list[LpPair]]:
    """One run of every job: its speed figures, and each cell's option log-probs by the chain rule."""
    started = time.perf_counter()
    work = RawJobs(jobs=jobs)
    loop.run([work])
    values = work.unwrap()
    wall_s = time.perf_counter() - started
    lps = [
        tuple(math.fsum(values[(j, node, token)] for node, token in option) for option in cell)
        for j, per_cell in enumerate(reads)
        for cell in per_cell
    ]
    speed = {
        "wall_s": round(wall_s, 4),
        "gpu_busy_s": round(work.busy_s, 4),
        "tokens": work.ran_tokens,
        "tok_s": round(work.ran_tokens / wall_s, 1) if wall_s > 0 else None,
        "forward_passes": work.passes,
    }
    return speed, lps


@attrs.frozen
class ParityFiles:
    """The checked inputs of a ``spinf-serve parity`` run, read before the (slow) model load."""

    fixture: dict
    fixture_path: str
    reference: dict | None
    reference_path: str | None


def read_files(fixture_path: str | None, reference_path: str | None) -> ParityFiles:
    """The fixture (the built-in one when ``fixture_path`` is None) and the reference, checked against each other."""
    fixture = read_fixture(fixture_path)
    reference = None
    if reference_path:
        reference = read_fixture(reference_path, flag="--reference")
        check_reference(fixture, reference, f"--reference {reference_path}")
    return ParityFiles(fixture, fixture_path or BUILTIN, reference, reference_path)


def run_engine(
    engine: Engine, files: ParityFiles, *, passes: int, record: str | None, load_s: float
) -> tuple[dict, Verdict | None]:
    """The report of ``spinf-serve parity`` on a loaded `Engine`, and, when a ``--reference`` was given, the
    `Verdict` of the last pass against it. With ``record``, the recorded reference is written there."""
    info = engine.info()
    platform = engine_platform(info, engine.device.type)
    name = engine_reference_name(info, platform)
    try:
        report = run_parity(
            engine.loop,
            files.fixture,
            files.reference,
            passes=passes,
            record=name if record else None,
            engine=info,
            platform=platform,
        )
    except ConfigError as exc:  # a cell this model's tokenizer cannot read as the fixture means
        raise ConfigError(f"--fixture {files.fixture_path}: {exc}") from exc
    report["boot"] = {"load_s": round(load_s, 3), **report["boot"]}
    report["fixture"]["path"] = files.fixture_path
    report["platform"] = platform
    if report["reference"] is not None:
        report["reference"]["path"] = files.reference_path or files.fixture_path
    if record:
        write_fixture(report.pop("recorded"), record)
        report["recorded"] = {"path": str(record), "reference": name}
    if files.reference is None:
        report["check"] = None
        return report, None
    verdict = judge(report["passes"][-1]["parity"], files.reference, files.reference_path, platform, info["quant"])
    report["check"] = verdict.as_json()
    return report, verdict
