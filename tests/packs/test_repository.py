"""Reading a source folder (packs spec §3): the repository manifest (schema, namespace, duplicates, referenced
paths, file against entry, coming soon) and discovery without one (what is skipped silently, what is a problem)."""

from __future__ import annotations

import logging
import os
import random
import threading

from spinf.packs.manifest import MANIFEST_NAME
from spinf.packs.packfile import read_pack_file
from spinf.packs.repository import scan_folder
from tests.packs.folders import MINIMAL, entry, manifest, tone, version, write
from tests.packs.mutate import mutate


def rendered(scan) -> list[str]:
    return [p.render() for p in scan.problems]


def test_a_manifest_folder_loads_its_versions_with_the_entry_metadata(tmp_path):
    write(tmp_path, "packs/tone/1.0.0.json", tone())
    write(tmp_path, "packs/tone/1.1.0.json", tone(version="1.1.0"))
    write(tmp_path, "docs/tone.md", "# Tone")
    listed = entry(
        "acme/tone",
        version("1.1.0", "packs/tone/1.1.0.json", status="deprecated", note="old"),
        version(),
        description="How rude",
        tags=["tone"],
        readme="docs/tone.md",
    )
    write(tmp_path, MANIFEST_NAME, manifest(listed))
    scan = scan_folder(tmp_path)
    assert scan.problems == ()
    assert scan.manifest.namespace == "acme" and scan.manifest.name == "Acme packs"
    assert [(p.pack.version, p.status, p.note) for p in scan.packs] == [
        ("1.1.0", "deprecated", "old"),
        ("1.0.0", "available", None),
    ]
    first = scan.packs[0]
    assert (first.name, first.description, first.tags, first.readme) == ("Tone", "How rude", ("tone",), "docs/tone.md")
    assert scan.listed == {("acme/tone", "1.0.0"), ("acme/tone", "1.1.0")}


def test_an_invalid_manifest_is_one_problem_with_every_location_and_nothing_loads(tmp_path):
    write(tmp_path, "packs/tone/1.0.0.json", tone())
    bad = {"format": 2, "namespace": "Acme", "packs": [{"id": "acme/tone", "versions": [{"file": 3}]}]}
    write(tmp_path, MANIFEST_NAME, bad)
    scan = scan_folder(tmp_path)
    assert scan.packs == () and scan.manifest is None
    [problem] = scan.problems
    assert problem.file == MANIFEST_NAME
    for location in ("format:", "namespace:", "packs.0.name:", "packs.0.versions.0.version:", "versions.0.file:"):
        assert location in problem.message
    write(tmp_path, MANIFEST_NAME, "{not json")
    [problem] = scan_folder(tmp_path).problems
    assert problem.message.startswith("the repository manifest is not JSON")


def test_entries_outside_the_namespace_or_listed_twice_are_skipped_with_a_problem(tmp_path):
    write(tmp_path, "packs/tone/1.0.0.json", tone())
    write(tmp_path, MANIFEST_NAME, manifest(entry("other/tone"), entry(), entry()))
    scan = scan_folder(tmp_path)
    assert [p.pack.id for p in scan.packs] == ["acme/tone"]
    assert rendered(scan) == [
        f"{MANIFEST_NAME}: packs.0: 'other/tone' is not in the manifest's namespace 'acme'",
        f"{MANIFEST_NAME}: packs.2: 'acme/tone' is listed twice; the second entry is skipped",
    ]


def test_missing_paths_are_problems_and_a_coming_soon_version_may_lack_its_file(tmp_path):
    write(tmp_path, "packs/tone/1.0.0.json", tone())
    listed = entry(
        "acme/tone",
        version(fixture="fixtures/none.json"),
        version("1.0.0"),
        version("2.0.0", "packs/tone/2.0.0.json"),
        version("3.0.0", "packs/tone/3.0.0.json", status="coming_soon"),
        readme="docs/none.md",
        samples="../outside.jsonl",
    )
    write(tmp_path.parent, "outside.jsonl", "{}")
    write(tmp_path, MANIFEST_NAME, manifest(listed))
    scan = scan_folder(tmp_path)
    assert [p.pack.version for p in scan.packs] == ["1.0.0"]  # still loaded: a missing readme does not skip it
    paths = [p.path for p in scan.problems]
    assert paths == [
        "packs.0.readme",
        "packs.0.samples",
        "packs.0.versions.0.fixture",
        "packs.0.versions.1",
        "packs.0.versions.2.file",
    ]
    assert "acme/tone 1.0.0 is listed twice" in rendered(scan)[3]
    assert scan.coming_soon == (("acme/tone", "3.0.0"),)


def test_a_coming_soon_version_with_its_file_is_loaded_as_coming_soon(tmp_path):
    write(tmp_path, "packs/tone/1.0.0.json", tone())
    write(tmp_path, MANIFEST_NAME, manifest(entry("acme/tone", version(status="coming_soon"))))
    scan = scan_folder(tmp_path)
    assert [p.status for p in scan.packs] == ["coming_soon"] and scan.problems == ()


def test_a_listed_file_with_problems_is_not_added_and_its_problems_name_it(tmp_path):
    write(tmp_path, "packs/tone/1.0.0.json", tone(answers="x", version="1_0"))
    write(tmp_path, MANIFEST_NAME, manifest(entry()))
    scan = scan_folder(tmp_path)
    assert scan.packs == ()
    assert rendered(scan) == [
        "packs/tone/1.0.0.json: version: the version must start with a letter or digit, then letters, digits, "
        "'.', '+', '-'",
        "packs/tone/1.0.0.json: answers: answers must be one of 'p', 'logprob'",
    ]


def test_a_file_that_is_not_the_listed_version_is_not_added(tmp_path):
    write(tmp_path, "packs/tone/1.0.0.json", tone(model="spinf-12b"))  # the same model by alias: still a mismatch
    write(tmp_path, MANIFEST_NAME, manifest(entry()))
    scan = scan_folder(tmp_path)
    assert scan.packs == ()
    [problem] = rendered(scan)
    assert "'spinf/gemma-4-12b-fp8'" in problem and "'spinf-12b'" in problem


def test_a_media_or_parameter_difference_is_a_problem_but_the_pack_is_added(tmp_path):
    pack = tone(media=["text", "image"], parameters={"brand": {"label": "Brand"}})
    write(tmp_path, "packs/tone/1.0.0.json", pack)
    write(tmp_path, MANIFEST_NAME, manifest(entry()))
    scan = scan_folder(tmp_path)
    assert [p.pack.id for p in scan.packs] == ["acme/tone"]
    media, parameters = rendered(scan)
    assert "media ['text'], the file ['image', 'text']" in media
    assert "parameters [], the file ['brand']" in parameters


def test_discovery_loads_pack_files_in_sorted_path_order_and_skips_the_rest_silently(tmp_path):
    write(tmp_path, "b/tone.json", tone())
    write(tmp_path, "a/minimal.json", MINIMAL)
    write(tmp_path, "a/fixture.json", {"input_id": "0", "queries": []})  # no "pack" text
    write(tmp_path, "a/sample.json", {"pack": "acme/tone", "inputs": []})  # no scoring key
    write(tmp_path, "a/broken.json", '{"pack": ')  # not JSON
    write(tmp_path, "a/notes.txt", '{"pack": 1, "scoring": 1}')
    write(tmp_path, ".hidden/tone.json", tone(version="9"))
    write(tmp_path, "a/.tone.json", tone(version="8"))
    write(tmp_path, "c/bad.json", {"pack": "acme/bad", "scoring": {}})
    scan = scan_folder(tmp_path)
    assert scan.manifest is None
    assert [(p.pack.id, p.file, p.status, p.name) for p in scan.packs] == [
        ("example/off-topic", "a/minimal.json", "available", ""),
        ("acme/tone", "b/tone.json", "available", ""),
    ]
    assert [p.file for p in scan.problems] == ["c/bad.json"] * 6  # its six missing top-level fields
    assert scan.problems[0].render() == "c/bad.json: version: the top-level field 'version' is missing"


def test_discovery_of_a_missing_folder_finds_nothing(tmp_path):
    scan = scan_folder(tmp_path / "none")
    assert scan.packs == () and scan.problems == ()


def test_no_manifest_makes_the_scan_crash(tmp_path):
    write(tmp_path, "packs/tone/1.0.0.json", tone())
    write(tmp_path, "docs/tone.md", "# Tone")
    good = manifest(entry("acme/tone", version(fixture="docs/tone.md"), readme="docs/tone.md", media=["text"]))
    rng = random.Random(3)
    for _ in range(1500):
        damaged = good
        for _ in range(rng.randint(1, 3)):
            damaged = mutate(damaged, rng)
        write(tmp_path, MANIFEST_NAME, damaged)
        scan = scan_folder(tmp_path)
        assert all(p.render() for p in scan.problems)
        assert len(scan.packs) <= 1


def scan_in_time(folder, seconds: float = 10.0):
    """`scan_folder` in a thread that must finish within ``seconds`` (a blocked open would hang the test run)."""
    done = []
    worker = threading.Thread(target=lambda: done.append(scan_folder(folder)), daemon=True)
    worker.start()
    worker.join(seconds)
    assert done, f"scan_folder({folder}) did not return within {seconds} s"
    return done[0]


def test_a_fifo_in_a_discovered_folder_is_skipped_with_a_log_line(tmp_path, caplog):
    """Regression: a FIFO named ``*.json`` blocked the catalog build (the start, a reload) for ever."""
    write(tmp_path, "a/tone.json", tone())
    os.mkfifo(tmp_path / "a" / "pipe.json")
    os.mkfifo(tmp_path / MANIFEST_NAME)  # not a manifest either: the folder is read by discovery
    with caplog.at_level(logging.WARNING, logger="spinf.packs.repository"):
        scan = scan_in_time(tmp_path)
    assert [p.file for p in scan.packs] == ["a/tone.json"] and scan.problems == ()
    assert sorted(r.getMessage().split(": ", 1)[1] for r in caplog.records) == [
        "a/pipe.json is not a regular file (a FIFO, socket or device); skipped",
        f"{MANIFEST_NAME} is not a regular file (a FIFO, socket or device); skipped",
    ]


def test_a_fifo_listed_in_a_manifest_is_a_missing_file(tmp_path):
    write(tmp_path, MANIFEST_NAME, manifest(entry("acme/tone", version(), readme="README.md")))
    (tmp_path / "packs" / "tone").mkdir(parents=True)
    os.mkfifo(tmp_path / "packs" / "tone" / "1.0.0.json")
    os.mkfifo(tmp_path / "README.md")
    scan = scan_in_time(tmp_path)
    assert scan.packs == ()
    assert [p.render() for p in scan.problems] == [
        f"{MANIFEST_NAME}: packs.0.readme: acme/tone: the readme 'README.md' does not exist in the folder",
        f"{MANIFEST_NAME}: packs.0.versions.0.file: acme/tone 1.0.0: the file 'packs/tone/1.0.0.json' does not exist "
        "in the folder",
    ]


def test_read_pack_file_refuses_a_fifo_without_blocking(tmp_path):
    os.mkfifo(tmp_path / "pipe.json")
    done = []
    worker = threading.Thread(target=lambda: done.append(read_pack_file(tmp_path / "pipe.json")), daemon=True)
    worker.start()
    worker.join(10)
    [parsed] = done
    assert [p.message for p in parsed.problems] == ["the file is not a regular file (a FIFO, socket or device)"]


def test_discovery_refuses_a_link_to_a_file_outside_the_folder(tmp_path):
    """Regression (issue 33 item 6): discovery followed a file symlink out of the folder and served the pack it
    found there. Now such a link is a problem naming it, as a manifest's path out of the folder is, and nothing is
    read through it; a link that stays inside the folder is still read."""
    outside, folder = tmp_path / "outside", tmp_path / "folder"
    write(outside, "secret.json", tone(version="6.6.6"))
    write(folder, "a/tone.json", tone())
    (folder / "a" / "stolen.json").symlink_to(outside / "secret.json")
    (folder / "b").mkdir()
    (folder / "b" / "again.json").symlink_to(folder / "a" / "tone.json")
    scan = scan_in_time(folder)
    assert [(p.file, p.pack.version) for p in scan.packs] == [("a/tone.json", "1.0.0"), ("b/again.json", "1.0.0")]
    assert [p.render() for p in scan.problems] == [
        "a/stolen.json: a link to a file outside the folder; not read (a source serves its folder)"
    ]
