"""Run by ``test_run.py`` as ``python -m tests.bulk.slow_run INPUTS OUTPUT LOG HANG_FROM`` in a process it kills.

It scores with a fake scorer (two workers, batches of 10) that hangs forever on batches starting at input number
HANG_FROM or later, and appends the ids of every batch it *answers* to LOG before answering: LOG then lists each
input this process scored, so the test can count scorings across the killed run and the resumed one.
"""

from __future__ import annotations

import sys
import time

from spinf.bulk import run_bulk
from tests.bulk.fakes import fake_response


def main() -> None:
    inputs, output, log, hang_from = sys.argv[1:]

    def scorer(body: dict) -> dict:
        ids = [item["id"] for item in body["inputs"]]
        if int(ids[0].split("-")[1]) >= int(hang_from):
            time.sleep(3600)
        with open(log, "a") as file:
            file.write("".join(i + "\n" for i in ids))
        return fake_response(body)

    run_bulk({"scoring": {}}, inputs, output, scorer=scorer, batch_size=10, concurrency=2)


if __name__ == "__main__":
    main()
