"""Bulk scoring (``spinf-serve score``): millions of inputs from a JSON Lines file, results to another, resumable.

- `spinf.bulk.inputs`: the shared request part, reading and checking the inputs file, batching by count and bytes;
- `spinf.bulk.output`: the output format (documented there), the append-only writer, reading a run back;
- `spinf.bulk.remote`: scorers that POST to running servers, retrying like spinf-client;
- `spinf.bulk.progress`: the terminal progress bar;
- `spinf.bulk.run`: `run_bulk`, the loop that ties them together;
- `spinf.bulk.command`: `main`, what the command line calls.

Importing this package does not import torch: the engine is built only when ``score`` runs in-process.
"""

from spinf.bulk.command import main
from spinf.bulk.errors import BatchFailed, BulkError, BulkInputError, RemoteApiError
from spinf.bulk.remote import http_scorers
from spinf.bulk.run import BulkStats, Interrupted, run_bulk

__all__ = [
    "BatchFailed",
    "BulkError",
    "BulkInputError",
    "BulkStats",
    "Interrupted",
    "RemoteApiError",
    "http_scorers",
    "main",
    "run_bulk",
]
