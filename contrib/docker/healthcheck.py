#!/usr/bin/env python3
"""The container's HEALTHCHECK: ``GET /readyz`` on the address the running server listens on; exit 0 when ready.

The address is the one the server itself read at its start, from the same layers (``--host``/``--port`` flags,
``SPINF_*`` variables, the config file): the probe finds the ``spinf-serve serve`` process (PID 1, the image's
entrypoint, else the first such process, as under ``docker run --init``), reads its command line, environment and
working folder from ``/proc``, and gives them to spinf's own parser and settings loader (`spinf.cli.serve_flags`,
`spinf.settings.load_settings`). Nothing is configured twice, and the server writes no file for it. A wildcard
host (``0.0.0.0``, ``::``) is asked on loopback. A config file edited since the start is read as it is now.

Exit status: 0 ready; 1 not ready or no answer (Docker counts both as a failed check); 2 no server process found
or its settings unreadable.
"""

from __future__ import annotations

import argparse
import os
import sys
import urllib.request
from pathlib import Path

from spinf.cli import serve_flags
from spinf.errors import SpinfError
from spinf.settings import load_settings

_LOOPBACK = {"": "127.0.0.1", "0.0.0.0": "127.0.0.1", "::": "::1"}


def serve_argv(cmdline: list[str]) -> list[str] | None:
    """The words after ``serve`` in a ``spinf-serve serve ...`` or ``python -m spinf serve ...`` command line, else
    None."""
    for at in range(1, len(cmdline)):
        ran = cmdline[at - 1]
        if cmdline[at] == "serve" and (Path(ran).name == "spinf-serve" or cmdline[at - 2 : at] == ["-m", "spinf"]):
            return cmdline[at + 1 :]
    return None


def _read_nul_separated(path: Path) -> list[str]:
    return [part.decode(errors="replace") for part in path.read_bytes().split(b"\0") if part]


def find_server(proc: Path = Path("/proc"), pid: int | None = None) -> tuple[list[str], dict[str, str], Path]:
    """The server's words after ``serve``, its environment and its working folder: of ``pid`` when given, else of
    PID 1 when it is the server, else of the lowest-numbered server process. Raises LookupError when none is."""
    if pid is not None:
        candidates = [proc / str(pid)]
    else:
        numbered = sorted(int(entry.name) for entry in proc.iterdir() if entry.name.isdigit())
        candidates = [proc / str(number) for number in numbered]
    for folder in candidates:
        try:
            argv = serve_argv(_read_nul_separated(folder / "cmdline"))
            if argv is None:
                continue
            environ = dict(item.partition("=")[::2] for item in _read_nul_separated(folder / "environ"))
            return argv, environ, (folder / "cwd").resolve()
        except OSError:  # a process that ended meanwhile, or one of another user's
            continue
    raise LookupError("no spinf-serve serve process")


def readyz_url(argv: list[str], environ: dict[str, str], cwd: Path) -> str:
    """``/readyz`` at the server's address, its settings read as it read them (a relative config path from its
    working folder)."""
    os.chdir(cwd)
    server = load_settings(serve_flags(argv), environ).server
    host = _LOOPBACK.get(server.host, server.host)
    return f"http://{f'[{host}]' if ':' in host else host}:{server.port}/readyz"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="GET /readyz on the running spinf-serve server's own address")
    parser.add_argument("--pid", type=int, default=None, help="the server's process (default: PID 1, else found)")
    parser.add_argument("--timeout-s", type=float, default=4.0)
    args = parser.parse_args(argv)
    try:
        url = readyz_url(*find_server(pid=args.pid))
    except (LookupError, SpinfError, SystemExit) as error:
        print(f"spinf-healthcheck: cannot tell the server's address: {error}", file=sys.stderr)
        return 2
    try:
        with urllib.request.urlopen(url, timeout=args.timeout_s) as answer:
            answer.read()
    except OSError as error:  # urllib's HTTPError (503: not ready) included
        print(f"spinf-healthcheck: {url}: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
