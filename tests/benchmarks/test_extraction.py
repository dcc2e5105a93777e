"""benchmarks/extraction.py's ``--count`` on the CPU: what each slot call runs beside its base call (the tokens its
passes scored, the decoder's chunks, model steps and rows, from `Extractor.tally`), with the 12B's default budgets
scaled onto the small model (``--like-12b``). The GPU timings of the same calls are in benchmarks/RESULTS.md."""

from __future__ import annotations

import re

import pytest

from benchmarks import extraction
from spinf.engine.extraction import budget

COLUMNS = ["slots", "passes", "scored", "decodes", "chunks", "steps", "rows", "live", "per_slot", "ranked"]


def counted(out: str) -> dict[tuple[str, str], dict[str, float]]:
    rows = {}
    for line in out.splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) == 2 + len(COLUMNS) and re.fullmatch(r"[\d.]+", cells[2]):
            rows[cells[0], cells[1]] = dict(zip(COLUMNS, map(float, cells[2:]), strict=True))
    return rows


@pytest.mark.slow  # about a minute on two cores: the default run keeps within ten minutes
def test_the_count_gives_each_slot_call_its_decoder_work(tmp_path, capsys):
    logit_bytes = budget.LOGIT_BYTES
    argv = ["--device", "cpu", "--scaled", "--inputs", "2", "--questions", "2", "--work", str(tmp_path)]
    extraction.main([*argv, "--count", "--like-12b"])
    assert budget.LOGIT_BYTES == logit_bytes  # the 12B's scale holds while the calls run, not after
    rows = counted(capsys.readouterr().out)
    assert len(rows) == 8
    for (name, _), row in rows.items():
        assert row["slots"] == 2 * (8 if name.startswith("+8") else 1)
        assert row["scored"] > 0  # each slot's template path, scored in its input's pass
        # no model step runs once every beam was pruned and every sequence ended: each feeds a live row
        assert row["live"] >= row["steps"]
        assert row["rows"] == row["per_slot"] * row["slots"]
    n = rows["+1 searched {n} per input", "full_length"]
    # 6 beams × max_tokens 16, none pruned; each beam ranks the vocabulary at each of the 17 choices
    assert (n["steps"], n["per_slot"], n["ranked"]) == (16 * n["chunks"], 6 * 16, n["slots"] * 6 * 17)
    generated = rows["+1 generated 32-token {*} per input", "full_length"]
    # one row each, 31 steps: the 32nd token is chosen on the 31st step's log-probs, and nothing reads after it
    expected = (31 * generated["chunks"], 31, generated["slots"] * 32)
    assert (generated["steps"], generated["per_slot"], generated["ranked"]) == expected
