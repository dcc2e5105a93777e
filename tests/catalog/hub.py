"""Fakes for the catalog tests: checkpoints on disk (Hub-cache snapshots and ``hf download --local-dir`` folders),
damaged shards, and a Hub on loopback that answers huggingface_hub's model lookup and serves files.

Shards are real safetensors files (written by the ``safetensors`` library, without torch) so the completeness
checks read the same bytes they read in production; a few float32 values each keep them tiny.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

from tests.loopback import JsonHandler, LoopbackServer

ROOT = Path(__file__).resolve().parents[2]
GEMMA_CONFIG = {"model_type": "gemma4_unified", "architectures": ["Gemma4UnifiedForConditionalGeneration"]}
QWEN_CONFIG = {"model_type": "qwen3_5", "architectures": ["Qwen3_5ForConditionalGeneration"]}
LLAMA_CONFIG = {"model_type": "llama", "architectures": ["LlamaForCausalLM"]}


def write_checkpoint(folder: Path, *, config: dict | None = None, shards: int = 2, index: bool = True) -> Path:
    """A complete checkpoint in ``folder``: config.json, ``shards`` safetensors files and (optionally) their index."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(GEMMA_CONFIG if config is None else config))
    weight_map = {}
    for number in range(1, shards + 1):
        name = f"model-{number:05d}-of-{shards:05d}.safetensors" if index else "model.safetensors"
        save_file({f"layer{number}.weight": np.full((4, 4), number, dtype=np.float32)}, str(folder / name))
        weight_map[f"layer{number}.weight"] = name
    if index:
        (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return folder


def write_snapshot(root: Path, repo: str, revision: str, **kwargs) -> Path:
    """A complete snapshot in the Hub cache layout under ``root``, with ``refs/main`` pointing at it."""
    repo_dir = root / ("models--" + repo.replace("/", "--"))
    folder = write_checkpoint(repo_dir / "snapshots" / revision, **kwargs)
    (repo_dir / "refs").mkdir(exist_ok=True)
    (repo_dir / "refs" / "main").write_text(revision)
    return folder


def write_local_dir(folder: Path, commit: str, **kwargs) -> Path:
    """A checkpoint as ``hf download --local-dir`` leaves it: files plus one metadata file per file."""
    write_checkpoint(folder, **kwargs)
    metadata = folder / ".cache" / "huggingface" / "download"
    metadata.mkdir(parents=True, exist_ok=True)
    for path in folder.iterdir():
        if path.is_file():
            (metadata / f"{path.name}.metadata").write_text(f'{commit}\n"etag"\n1700000000.0\n')
    return folder


def truncate(path: Path, num_bytes: int = 1) -> None:
    """Cuts the last ``num_bytes`` off a file, as an interrupted download leaves it."""
    data = path.read_bytes()
    path.write_bytes(data[:-num_bytes])


def rewrite_header(path: Path, tensor: str, **changes) -> None:
    """Changes the header entry of ``tensor`` in a safetensors file, keeping the header's length (padded with spaces,
    as the format allows) so that the data stays where it was: a file that is whole but whose header lies."""
    data = path.read_bytes()
    length = int.from_bytes(data[:8], "little")
    header = json.loads(data[8 : 8 + length])
    header[tensor].update(changes)
    text = json.dumps(header, separators=(",", ":")).encode()
    if len(text) > length:
        raise ValueError(f"the changed header needs {len(text)} bytes, the file has {length}")
    path.write_bytes(data[:8] + text.ljust(length) + data[8 + length :])


class _HubHandler(JsonHandler):
    def do_HEAD(self) -> None:
        self._record()
        self._file(body=False)

    def do_GET(self) -> None:
        hub: FakeHub = self.server.fake
        self._record()
        if not self.path.startswith("/api/models/"):
            self._file(body=True)
            return
        hub.seen.append(self.path)
        path = self.path.split("?")[0].removeprefix("/api/models/")
        repo, tree, tree_revision = path.partition("/tree/")
        repo, _, revision = repo.partition("/revision/")
        revision = tree_revision.split("/")[0] if tree else revision
        if repo not in hub.repos:
            self.answer(404, {"error": "Repository not found"}, {"X-Error-Code": "RepoNotFound"})
        elif revision and revision not in (hub.repos[repo], "main"):
            self.answer(404, {"error": "Invalid rev id"}, {"X-Error-Code": "RevisionNotFound"})
        elif tree:
            self.answer(200, [_tree_entry(name, data) for name, data in hub.files.get(repo, {}).items()], {})
        else:
            siblings = [{"rfilename": name} for name in hub.files.get(repo, {})]
            self.answer(200, {"id": repo, "sha": hub.repos[repo], "siblings": siblings}, {})

    def _record(self) -> None:
        self.server.fake.requests.append(f"{self.command} {self.path}")

    def _file(self, *, body: bool) -> None:
        """``/<repo>/resolve/<revision>/<file>``, as huggingface_hub downloads a file; anything else is a 404."""
        hub: FakeHub = self.server.fake
        repo, _, rest = self.path.lstrip("/").partition("/resolve/")
        revision, _, name = rest.partition("/")
        data = hub.files.get(repo, {}).get(name)
        if data is None or revision not in (hub.repos.get(repo), "main"):
            self.answer(404, b"" if not body else {"error": "Entry not found"}, {"X-Error-Code": "EntryNotFound"})
            return
        self.send_response(200)
        for header, value in [
            ("Content-Type", "application/octet-stream"),
            ("Content-Length", str(len(data))),
            ("ETag", f'"{hashlib.sha1(data).hexdigest()}"'),
            ("X-Repo-Commit", hub.repos[repo]),
        ]:
            self.send_header(header, value)
        self.end_headers()
        if body:
            self.wfile.write(data)


def _tree_entry(name: str, data: bytes) -> dict:
    return {"type": "file", "path": name, "size": len(data), "oid": hashlib.sha1(data).hexdigest()}


class FakeHub(LoopbackServer):
    """A Hub on 127.0.0.1 for ``repos``, ``{repo: its revision}``, serving ``files``, ``{repo: {name: bytes}}``: the
    model lookup (``GET /api/models/<repo>[/revision/<rev>]``, as ``HfApi.model_info`` asks it), the file listing
    (``/api/models/<repo>/tree/<rev>``) and the files (``/<repo>/resolve/<rev>/<name>``), as ``snapshot_download``
    fetches them. Any other repo, revision or file is the Hub's 404. ``requests`` records every request that reached
    it (``"GET /path"``; huggingface_hub's own fetch of its agent registry too, unless telemetry is off), ``seen``
    the paths of the ``/api/models/`` ones."""

    def __init__(self, repos: dict[str, str], files: dict[str, dict[str, bytes]] | None = None):
        super().__init__(_HubHandler)
        self.repos = dict(repos)
        self.files = dict(files or {})
        self.requests: list[str] = []
        self.seen: list[str] = []

    def serve_here(self, monkeypatch) -> None:
        """Points this process's huggingface_hub at this Hub: its endpoint and its file URL template (built from
        ``HF_ENDPOINT`` when huggingface_hub is imported, so setting the variable now would not move it)."""
        monkeypatch.setattr("huggingface_hub.constants.ENDPOINT", self.url)
        template = self.url + "/{repo_id}/resolve/{revision}/{filename}"
        monkeypatch.setattr("huggingface_hub.constants.HUGGINGFACE_CO_URL_TEMPLATE", template)
        monkeypatch.setenv("HF_ENDPOINT", self.url)


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then closed)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run_serve(tmp_path: Path, endpoint: str, *args: str, **env: str) -> subprocess.CompletedProcess:
    """``spinf-serve serve ARGS`` (as ``python -m spinf``) with the Hub at ``endpoint``, an empty ``HF_HOME`` of its
    own, no ``SPINF_*``, ``HF_*`` or proxy variable of the caller's, and ``env`` added."""
    keep = {k: v for k, v in os.environ.items() if not k.startswith(("SPINF_", "HF_")) and "proxy" not in k.lower()}
    keep.update(HF_HOME=str(tmp_path / "home"), HF_ENDPOINT=endpoint, **env)
    command = [sys.executable, "-m", "spinf", "serve", *args, "--port", str(closed_port())]
    # a server that came up would run until killed: the timeout turns that into a failure
    return subprocess.run(command, cwd=ROOT, env=keep, capture_output=True, text=True, timeout=60)
