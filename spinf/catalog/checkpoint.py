"""Checkpoint lookup (api spec §9.7): where the weights of a resolved model are on disk, fetching them if need be.

`find_checkpoint` uses a given folder as it is; otherwise it searches the cache roots in order
(``SPINF_CACHE_DIRS``, then ``$HF_HOME/hub``), then downloads from the Hub. The built-in tiny model is generated,
not downloaded, and generating it takes torch: for it the lookup raises `TinySnapshotMissing`, naming the first
writable root as where the snapshot goes, and the engine writes it there (`spinf.engine.gemma4.tiny.find_or_generate`)
and has it checked by `generated_checkpoint`. In a root it recognises:

- the Hub cache layout, ``<root>/models--<org>--<name>/snapshots/<revision>/`` (the revision is the folder name;
  unpinned, ``refs/main`` is preferred, else the newest complete snapshot);
- a ``hf download --local-dir`` folder at ``<root>/<org>--<name>/`` or ``<root>/<org>/<name>/``, and, for a pinned
  revision only (nothing in it names the repo), the root itself. Its revision is the commit its
  ``.cache/huggingface/download/*.metadata`` files record, when they all agree.

A snapshot counts only when complete (`snapshot_problem`: every shard present, not truncated, and with a header
that safetensors accepts) and, with a pinned revision, when its revision matches. `check_findable` refuses, before
a server starts, a Hub repo id that no cache root holds and the Hub does not know (api spec §9.6). Nothing here
imports torch or `spinf.engine` (an import-linter contract holds it).
"""

from __future__ import annotations

import importlib
import logging
import os
from pathlib import Path

import attrs

from spinf.catalog.manifest import Catalog, load_catalog
from spinf.catalog.resolve import ResolvedModel, detect_family, detect_format, read_config, resolve_model
from spinf.catalog.snapshot import local_dir_revision, snapshot_problem
from spinf.errors import ModelError

logger = logging.getLogger(__name__)

CACHE_DIRS_ENV = "SPINF_CACHE_DIRS"
DOWNLOAD_PATTERNS = ["*.json", "*.safetensors", "tokenizer*"]
_TRUE_VALUES = {"1", "on", "yes", "true"}  # huggingface_hub's reading of HF_HUB_OFFLINE


@attrs.frozen
class Checkpoint:
    """A complete checkpoint on disk.

    ``revision`` is the snapshot's commit (folder name or local-dir metadata), or the folder's base name for a
    given folder without Hub metadata. ``weights`` is ``boot.weights``: the cache root it was found in,
    ``"downloaded"``, ``"generated"`` (the tiny model, just written) or ``"config"`` (a folder given as is).
    """

    folder: Path
    revision: str
    weights: str
    family: str
    weight_format: str

    def num_bytes(self) -> int:
        """The size of the checkpoint's ``*.safetensors`` files."""
        return sum(path.stat().st_size for path in self.folder.glob("*.safetensors"))


class TinySnapshotMissing(ModelError):
    """The built-in tiny model's snapshot is in no cache root; ``root`` (the first writable one) is where it goes.

    The engine catches it and generates the snapshot there (`spinf.engine.gemma4.tiny.find_or_generate`); a caller
    without the engine sees a `ModelError` that says so.
    """

    def __init__(self, resolved: ResolvedModel, root: Path):
        command = f"spinf-serve download {resolved.served_name}"
        super().__init__(
            f"the built-in model {resolved.repo_id} at revision {resolved.revision} is not generated yet; it goes in "
            f"{root}, written by the engine when it opens the model or by `{command}`"
        )
        self.resolved = resolved
        self.root = root


def cache_dirs_from_env() -> list[str]:
    """The roots of ``SPINF_CACHE_DIRS``, in order (empty entries skipped)."""
    return [part for part in os.environ.get(CACHE_DIRS_ENV, "").split(":") if part]


def default_hf_home() -> Path:
    """``HF_HOME``, resolved as huggingface_hub does (default ``$XDG_CACHE_HOME/huggingface``), read now."""
    default = os.path.join(os.environ.get("XDG_CACHE_HOME", os.path.join("~", ".cache")), "huggingface")
    return Path(os.path.expandvars(os.path.expanduser(os.environ.get("HF_HOME") or default)))


def offline_from_env() -> bool:
    value = os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE") or ""
    return value.lower() in _TRUE_VALUES


def find_checkpoint(
    resolved: ResolvedModel,
    *,
    model_dir: str = "",
    cache_dirs: list[str] | None = None,
    hf_home: str | None = None,
    offline: bool | None = None,
    download: bool = True,
) -> Checkpoint:
    """The checkpoint to load for ``resolved`` (§9.7), or `ModelError` saying what is missing and how to provide it.

    ``cache_dirs`` defaults to ``SPINF_CACHE_DIRS``, ``hf_home`` to `default_hf_home()`, ``offline`` to
    ``HF_HUB_OFFLINE``. With ``download=False`` (or offline) nothing is fetched.
    """
    given = Path(model_dir).expanduser() if model_dir else resolved.local_folder
    if given is not None:
        return _given_folder(resolved, given)
    roots = _roots(cache_dirs, hf_home)
    offline = offline_from_env() if offline is None else offline
    # downloads go to the last root, $HF_HOME/hub
    return _locate(resolved, roots, download_root=roots[-1], can_download=download and not offline)


def _roots(cache_dirs: list[str] | None, hf_home: str | None) -> list[Path]:
    """The cache roots in search order: ``cache_dirs`` (default ``SPINF_CACHE_DIRS``), then ``<hf_home>/hub``."""
    hub = Path(hf_home).expanduser() / "hub" if hf_home else default_hf_home() / "hub"
    return [*(Path(root).expanduser() for root in (cache_dirs_from_env() if cache_dirs is None else cache_dirs)), hub]


def check_findable(
    resolved: ResolvedModel,
    *,
    model_dir: str = "",
    revision: str = "",
    cache_dirs: list[str] | None = None,
    hf_home: str | None = None,
    offline: bool | None = None,
) -> None:
    """`ModelError`, one line naming it, for a Hub repo id outside the catalog that no cache root holds and the Hub
    does not know: api spec §9.6 refuses the start for it, rather than a server up with a failed load.

    Catalog models, local folders and a given ``model_dir`` pass without a look (their lookup and its errors come
    at load), as does a repo id with a complete snapshot (at ``revision`` when given) in a cache root. Otherwise the
    Hub at ``HF_ENDPOINT`` is asked whether the repo exists (with ``HF_TOKEN``, so a private repo counts); offline
    (``offline`` defaults to ``HF_HUB_OFFLINE``) it is not asked, and a Hub that cannot be reached or answers an
    error counts as not having it, the message saying which. The defaults are `find_checkpoint`'s.
    """
    repo = resolved.repo_id
    if model_dir or resolved.manifest is not None or repo is None:
        return
    roots = _roots(cache_dirs, hf_home)
    if _search(roots, repo, revision or None, skipped=[]) is not None:
        return
    offline = offline_from_env() if offline is None else offline
    absent = (
        "downloads are off (HF_HUB_OFFLINE), so the Hub was not asked" if offline else _hub_absence(repo, revision)
    )
    if absent is not None:
        raise ModelError(
            f"unknown model {resolved.served_name!r}: it is no catalog id or alias and no folder, no cache root holds "
            f"it ({', '.join(str(root) for root in roots)}), and {absent}; `spinf-serve models` lists the catalog"
        )


def _hub_absence(repo: str, revision: str) -> str | None:
    """Why the Hub does not have ``repo`` (at ``revision``), in words; None when it does."""
    from huggingface_hub import HfApi, constants
    from huggingface_hub.errors import GatedRepoError, HfHubHTTPError, RepositoryNotFoundError, RevisionNotFoundError

    api = HfApi(token=os.environ.get("HF_TOKEN") or None)
    hub = f"the Hub at {api.endpoint}"
    try:
        api.model_info(repo, revision=revision or None, timeout=constants.HF_HUB_ETAG_TIMEOUT)
    except GatedRepoError:
        return None  # it exists; whether this token may download it is the download's question
    except RevisionNotFoundError:
        return f"{hub} has no revision {revision} of it"
    except RepositoryNotFoundError:
        return f"{hub} has no model repo of that name (or a private one that HF_TOKEN gives no access to)"
    except HfHubHTTPError as error:
        status = error.response.status_code if error.response is not None else "an error"
        return f"{hub} answered {status} when asked for it, which counts as not found"
    except (OSError, *_transport_errors()) as error:
        return f"{hub} cannot be reached ({type(error).__name__}: {error}), which counts as not found"
    return None


def _transport_errors() -> tuple[type[Exception], ...]:
    """The HTTP library's own errors, which are no `OSError`: huggingface_hub 1.x raises httpx's, 2.x httpx2's."""
    errors = []
    for name in ("httpx", "httpx2"):
        try:
            errors.append(importlib.import_module(name).HTTPError)
        except ImportError:
            continue  # that huggingface_hub does not use it
    return tuple(errors)


def download_model(name: str, dir: str | None = None) -> Path:
    """The snapshot folder of ``name`` for ``spinf-serve download``: found or downloaded.

    With ``dir`` (a hub-cache root) only that root is searched and written; otherwise the roots of
    `find_checkpoint`, downloading into ``$HF_HOME/hub``. A local folder is checked and returned as it is. The tiny
    model, when missing, raises `TinySnapshotMissing` as `find_checkpoint` does.
    """
    resolved = resolve_model(name)
    if resolved.local_folder is not None:
        return _given_folder(resolved, resolved.local_folder).folder
    if dir is None:
        return find_checkpoint(resolved).folder
    root = Path(dir).expanduser()
    return _locate(resolved, [root], download_root=root, can_download=not offline_from_env()).folder


def describe_catalog(
    cache_dirs: list[str] | None = None, hf_home: str | None = None, *, catalog: Catalog | None = None
) -> list[dict]:
    """For ``spinf-serve models``: each manifest's names and status, and where a complete snapshot of its pinned
    revision lies locally (``present``, ``path``). Nothing is downloaded or generated."""
    catalog = load_catalog() if catalog is None else catalog
    roots = _roots(cache_dirs, hf_home)
    rows = []
    for manifest in catalog.manifests:
        found = None
        if manifest.source.revision is not None:
            found = _search(roots, manifest.source.repo, manifest.source.revision, skipped=[])
        rows.append(
            {
                "id": manifest.id,
                "name": manifest.name,
                "aliases": list(manifest.aliases),
                "family": manifest.family,
                "status": manifest.status,
                "present": found is not None,
                "path": str(found[0]) if found else None,
            }
        )
    return rows


def _given_folder(resolved: ResolvedModel, folder: Path) -> Checkpoint:
    if not folder.is_dir():
        raise ModelError(f"checkpoint folder {folder} does not exist")
    problem = snapshot_problem(folder)
    if problem is not None:
        raise ModelError(f"checkpoint folder {folder} is incomplete or damaged: {problem}")
    return _checkpoint(resolved, folder, local_dir_revision(folder) or folder.name, "config")


def _checkpoint(resolved: ResolvedModel, folder: Path, revision: str, weights: str) -> Checkpoint:
    """A `Checkpoint` with the architecture: the manifest's, else read from ``config.json``."""
    if resolved.manifest is not None:
        family, weight_format = resolved.manifest.family, resolved.manifest.source.format
    else:
        config = read_config(folder)
        family, weight_format = detect_family(config, folder / "config.json"), detect_format(config)
    return Checkpoint(folder=folder, revision=revision, weights=weights, family=family, weight_format=weight_format)


def _locate(resolved: ResolvedModel, roots: list[Path], *, download_root: Path, can_download: bool) -> Checkpoint:
    repo, revision = resolved.repo_id, resolved.revision
    if repo is None:
        raise ModelError(f"{resolved.served_name}: no checkpoint repo to look up")
    if resolved.manifest is None:
        pin = f"at revision {revision}" if revision else "unpinned"
        logger.warning("%s is not in the catalog: serving the Hub repo %s, without batch invariance", repo, pin)
    skipped: list[str] = []
    found = _search(roots, repo, revision, skipped)
    if found is not None:
        folder, found_revision, root = found
        logger.info("found %s@%s in %s", repo, found_revision, folder)
        return _checkpoint(resolved, folder, found_revision, str(root))
    if resolved.is_builtin:
        root = next((root for root in roots if _writable(root)), None)
        if root is None:
            raise ModelError(_missing_message(resolved, roots, skipped, "no cache root is writable to generate it in"))
        raise TinySnapshotMissing(resolved, root)
    if not can_download:
        raise ModelError(_missing_message(resolved, roots, skipped, "downloads are off (offline)"))
    folder = _download(resolved, download_root, roots, skipped)
    problem = snapshot_problem(folder)
    if problem is not None:
        raise ModelError(f"the download of {repo} at {folder} is incomplete: {problem}")
    if revision is not None and folder.name != revision:
        raise ModelError(f"the download of {repo} is revision {folder.name}, not the pinned {revision}")
    if revision is None:
        logger.warning("downloaded %s unpinned: revision %s", repo, folder.name)
    return _checkpoint(resolved, folder, folder.name, "downloaded")


def generated_checkpoint(resolved: ResolvedModel, folder: Path) -> Checkpoint:
    """The tiny model's snapshot just generated at ``folder``, checked (revision, completeness) as a `Checkpoint`
    whose ``weights`` is ``"generated"``; `ModelError` when the generator's revision or files are not the pinned
    ones."""
    if folder.name != resolved.revision:
        raise ModelError(
            f"the tiny model's generator writes revision {folder.name}, but its manifest pins {resolved.revision}"
        )
    problem = snapshot_problem(folder)  # the generator keeps a snapshot folder that exists, damaged or not
    if problem is not None:
        raise ModelError(f"the tiny model's snapshot {folder} is damaged: {problem}; remove it to have it generated")
    return _checkpoint(resolved, folder, folder.name, "generated")


def _writable(root: Path) -> bool:
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError:
        return False
    return os.access(root, os.W_OK | os.X_OK)


def _download(resolved: ResolvedModel, cache_dir: Path, roots: list[Path], skipped: list[str]) -> Path:
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError, OfflineModeIsEnabled

    logger.info("downloading %s@%s into %s", resolved.repo_id, resolved.revision or "main", cache_dir)
    try:
        folder = snapshot_download(
            resolved.repo_id,
            revision=resolved.revision,
            cache_dir=cache_dir,
            allow_patterns=DOWNLOAD_PATTERNS,
            token=os.environ.get("HF_TOKEN") or None,
        )
    except (HfHubHTTPError, LocalEntryNotFoundError, OfflineModeIsEnabled, OSError, *_transport_errors()) as error:
        reason = f"the download failed ({type(error).__name__}: {error})"
        raise ModelError(_missing_message(resolved, roots, skipped, reason)) from error
    return Path(folder)


def _missing_message(resolved: ResolvedModel, roots: list[Path], skipped: list[str], reason: str) -> str:
    revision = resolved.revision or "(unpinned: any revision)"
    lines = [
        f"the checkpoint {resolved.repo_id} at revision {revision} is not in any cache root "
        f"({', '.join(str(root) for root in roots)}) and {reason}.",
        "Provide it in one of three ways:",
        "  --model-dir FOLDER, a folder holding the checkpoint;",
        f"  a cache root that holds it, added to {CACHE_DIRS_ENV} (colon-separated);",
        f"  `spinf-serve download {resolved.served_name}` on a machine with network (or go online: unset "
        "HF_HUB_OFFLINE), then copy the cache over.",
    ]
    lines += [f"Skipped: {line}" for line in skipped]
    return "\n".join(lines)


def _search(roots: list[Path], repo: str, revision: str | None, skipped: list[str]) -> tuple[Path, str, Path] | None:
    """The first complete snapshot of ``repo`` (at ``revision`` when pinned) as (folder, revision, root)."""
    org, name = repo.split("/", 1)
    for root in roots:
        repo_dir = root / f"models--{org}--{name}"
        candidates = _hub_snapshots(repo_dir, revision)
        if revision is not None and (repo_dir / "snapshots").is_dir():
            others = sorted(path.name for path in (repo_dir / "snapshots").iterdir() if path.name != revision)
            skipped += [f"{repo_dir / 'snapshots' / other}: revision {other}, not the pinned one" for other in others]
        candidates += [root / f"{org}--{name}", root / org / name]
        if revision is not None:
            candidates.append(root)
        for folder in candidates:
            folder_revision = _revision_of(folder, root)
            if folder_revision is None or (revision is not None and folder_revision != revision):
                continue
            problem = snapshot_problem(folder)
            if problem is not None:
                logger.info("skipping incomplete snapshot %s: %s", folder, problem)
                skipped.append(f"{folder}: {problem}")
                continue
            return folder, folder_revision, root
    return None


def _hub_snapshots(repo_dir: Path, revision: str | None) -> list[Path]:
    """Snapshot folders of a Hub-cache repo to try: the pinned one, or all, ``refs/main`` first, newest next."""
    snapshots = repo_dir / "snapshots"
    if revision is not None:
        return [snapshots / revision]
    if not snapshots.is_dir():
        return []
    folders = sorted((path for path in snapshots.iterdir() if path.is_dir()), key=_mtime, reverse=True)
    ref = repo_dir / "refs" / "main"
    main = ref.read_text(encoding="utf-8").strip() if ref.is_file() else None
    return sorted(folders, key=lambda path: path.name != main)


def _mtime(path: Path) -> float:
    return path.stat().st_mtime


def _revision_of(folder: Path, root: Path) -> str | None:
    """A candidate folder's revision: a Hub snapshot's folder name, else its local-dir metadata commit."""
    if not folder.is_dir():
        return None
    if folder.parent.name == "snapshots" and folder.parent.parent.parent == root:
        return folder.name
    return local_dir_revision(folder)
