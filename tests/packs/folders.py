"""Source folders for the repository and ``packs validate`` tests: pack files and manifests written into tmp_path."""

from __future__ import annotations

import copy
import json
from pathlib import Path

FIXTURES = Path(__file__).parent / "fixtures"
TONE = json.loads((FIXTURES / "tone.json").read_text())
MINIMAL = json.loads((FIXTURES / "minimal.json").read_text())


def write(folder: Path, relative: str, value: object) -> Path:
    path = folder / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(value if isinstance(value, str) else json.dumps(value), encoding="utf-8")
    return path


def tone(**changes: object) -> dict:
    pack = copy.deepcopy(TONE)
    pack.update(changes)
    return pack


def manifest(*entries: dict, namespace: str = "acme") -> dict:
    return {"format": 1, "namespace": namespace, "name": "Acme packs", "packs": list(entries)}


def entry(pack_id: str = "acme/tone", *versions: dict, **fields: object) -> dict:
    listed = list(versions) or [version()]
    return {"id": pack_id, "name": "Tone", "versions": listed, **fields}


def version(v: str = "1.0.0", file: str = "packs/tone/1.0.0.json", **fields: object) -> dict:
    return {"version": v, "file": file, "model": "spinf/gemma-4-12b-fp8", **fields}
