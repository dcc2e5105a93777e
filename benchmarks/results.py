"""Where measurements are written: benchmarks/RESULTS.md, each section naming the command, machine, date, revision.

Torch-free, so the load tests of contrib/loadtest can use it as well as the engine benchmarks.
"""

from __future__ import annotations

import datetime
import os
import platform
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = Path(__file__).with_name("RESULTS.md")
HEADER = "# Benchmark results\n\nEach section: what ran, the command, the machine, the date, the revision.\n"


def revision() -> str:
    """``GIT_SHA`` if set, else the checkout's short commit, ``-dirty`` when the code has uncommitted changes."""
    if os.environ.get("GIT_SHA"):
        return os.environ["GIT_SHA"]
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT)
        paths = ["spinf", "benchmarks", "contrib", ":!benchmarks/RESULTS.md"]  # the figures themselves are no code
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", *paths], capture_output=True, text=True, cwd=ROOT
        )
    except OSError:
        return "unknown"
    sha = head.stdout.strip()
    return (f"{sha}-dirty" if dirty.stdout.strip() else sha) if sha else "unknown"


def cpu_machine() -> str:
    return f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"


def append_section(title: str, body: str, path: Path = RESULTS) -> str:
    """Append ``## title — date, revision`` and ``body`` to ``path``; the section's text."""
    text = f"\n## {title} — {datetime.date.today().isoformat()}, revision {revision()}\n\n{body.rstrip()}\n"
    if not path.exists():
        path.write_text(HEADER)
    with path.open("a") as f:
        f.write(text)
    return text
