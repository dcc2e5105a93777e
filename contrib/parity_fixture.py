"""Writes the built-in parity fixture (engine spec B.15) into the package: ``spinf/data/parity-fixture.json.gz``.

The fixture has the shape of the published one: 24 contents × 56 cells = 1,344 cells. The contents are the 24
articles of the written job set j1 (``fixtures/jobsets/j1.json``, original prose written for this project); the
cells are ``CELLS`` below, one template and four option pairs, written for this fixture. The cells carry no values
(``lp_pos``/``lp_neg`` are null, ``reference`` is null): a reference for a model comes from
``spinf-serve parity --record`` (see ``fixtures/README.md``).

Run from the repository root: ``python contrib/parity_fixture.py`` (or ``--check``, which compares the file's JSON
with a fresh build and writes nothing).
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
from pathlib import Path

from spinf.engine.parity import write_fixture

ROOT = Path(__file__).resolve().parent.parent
JOBSET = ROOT / "fixtures" / "jobsets" / "j1.json"
DEFAULT_OUTPUT = ROOT / "spinf" / "data" / "parity-fixture.json.gz"
DAY = "2026-11-29"  # when the cells were written; bump it with any change to them
TEMPLATE = "{X}\n\n{F} is likely to{CTX}"
RISE, GROW, BETTER, MORE = ["rise", "fall"], ["grow", "shrink"], ["improve", "worsen"], ["increase", "decrease"]
CELLS = [
    ("Oil prices", RISE),
    ("The local economy", GROW),
    ("Air quality", BETTER),
    ("Unemployment", MORE),
    ("The price of bread", RISE),
    ("The fishing fleet", GROW),
    ("Public finances", BETTER),
    ("The number of strikes", MORE),
    ("Electricity bills", RISE),
    ("Wind power capacity", GROW),
    ("Relations between the parties", BETTER),
    ("Tax revenue", MORE),
    ("Shipping rates", RISE),
    ("The workforce", GROW),
    ("Working conditions", BETTER),
    ("Public spending", MORE),
    ("Interest rates", RISE),
    ("The rail network", GROW),
    ("Traffic in the city centre", BETTER),
    ("Imports of gas", MORE),
    ("Rents in the capital", RISE),
    ("Export markets", GROW),
    ("The housing shortage", BETTER),
    ("Demand for steel", MORE),
    ("Bond yields", RISE),
    ("The tourism sector", GROW),
    ("Water quality", BETTER),
    ("Passenger numbers", MORE),
    ("Wages in the region", RISE),
    ("The harbour's cargo trade", GROW),
    ("The state of the roads", BETTER),
    ("Crime in the city", MORE),
    ("Share prices of utilities", RISE),
    ("Household savings", GROW),
    ("Investor sentiment", BETTER),
    ("Carbon emissions", MORE),
    ("Food prices", RISE),
    ("The budget surplus", GROW),
    ("Service at the port", BETTER),
    ("Hospital waiting times", MORE),
    ("Fuel costs", RISE),
    ("The number of small firms", GROW),
    ("The reliability of the grid", BETTER),
    ("Energy use", MORE),
    ("Ticket prices", RISE),
    ("The middle class", GROW),
    ("Trust in the government", BETTER),
    ("Investment in housing", MORE),
    ("Mortgage rates", RISE),
    ("Farm incomes", GROW),
    ("Living standards", BETTER),
    ("The number of visitors", MORE),
    ("Property values", RISE),
    ("The city's population", GROW),
    ("The outlook for jobs", BETTER),
    ("Government debt", MORE),
]


def build() -> dict:
    inputs = json.loads(JOBSET.read_text(encoding="utf-8"))["inputs"]
    cells = [{"template": TEMPLATE, "phrase": p, "pair": pair, "lp_pos": None, "lp_neg": None} for p, pair in CELLS]
    jobs = [{"id": inp["id"], "text": inp["messages"][0]["content"], "cells": cells} for inp in inputs]
    return {"day": DAY, "reference": None, "jobs": jobs}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT, help="where to write the fixture")
    parser.add_argument("--check", action="store_true", help="compare with --output, writing nothing")
    args = parser.parse_args(argv)
    fixture = build()
    if args.check:
        same = args.output.is_file() and json.loads(gzip.decompress(args.output.read_bytes())) == fixture
        print(f"{args.output}: {'up to date' if same else 'DIFFERS from a fresh build'}")
        return 0 if same else 1
    write_fixture(fixture, args.output)
    print(f"wrote {args.output} ({len(fixture['jobs'])} jobs x {len(CELLS)} cells)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
