"""The model catalog: manifests (api spec §9.5), model resolution (§9.6) and checkpoint lookup (§9.7).

``manifests/*.toml`` describe the models shipped with spinf-serve; `manifest` parses and checks them and builds the
`Catalog`; `resolve` turns the start-up model name into a `ResolvedModel`; `checkpoint` finds or downloads its
weights, and for the built-in tiny model says where its snapshot goes (`TinySnapshotMissing`; the engine generates
it). Nothing here imports torch or `spinf.engine`, so the command line and the web layer can use the catalog
freely. ``tiny_gemma4/tokenizer.json`` is the built-in tiny
model's tokenizer, read by `spinf.engine.gemma4.tiny`.
"""

from spinf.catalog.checkpoint import (
    Checkpoint,
    TinySnapshotMissing,
    describe_catalog,
    download_model,
    find_checkpoint,
    generated_checkpoint,
)
from spinf.catalog.manifest import Catalog, ImageSpec, Manifest, Source, load_catalog
from spinf.catalog.resolve import DEFAULT_MODEL, ResolvedModel, detect_family, resolve_model
from spinf.catalog.snapshot import snapshot_problem

__all__ = [
    "DEFAULT_MODEL",
    "Catalog",
    "Checkpoint",
    "ImageSpec",
    "Manifest",
    "ResolvedModel",
    "Source",
    "TinySnapshotMissing",
    "describe_catalog",
    "detect_family",
    "download_model",
    "find_checkpoint",
    "generated_checkpoint",
    "load_catalog",
    "resolve_model",
    "snapshot_problem",
]
