"""A local pack folder with a FIFO and with a link out of it, served by a real server process (issue 33 item 8).

A FIFO among the ``*.json`` files blocked the catalog build for ever, so the server never listened; now it is
skipped with a log line and the folder's packs are served. A link to a file outside the folder was followed and
its pack served; now it is a catalog error that names it, and the start is refused as for any catalog error.
"""

from __future__ import annotations

import os
import shutil

import httpx
import pytest

from contrib.loadtest.harness import ROOT, ServerProcess

PACK = ROOT / "fixtures" / "packs" / "moderation" / "0.1.0.json"


def test_a_fifo_in_the_folder_is_skipped_and_the_server_starts(tmp_path):
    folder = tmp_path / "packs"
    folder.mkdir()
    shutil.copy(PACK, folder / "moderation.json")
    os.mkfifo(folder / "pipe.json")
    server = ServerProcess(tmp_path / "run", "--packs", str(folder), "--no-official-packs", ready_s=90)
    try:
        listed = httpx.get(f"{server.url}/v1/packs", timeout=30).json()
        assert [entry["id"] for entry in listed["packs"]] == ["tiny/moderation"]
        assert "pipe.json is not a regular file (a FIFO, socket or device); skipped" in server.output()
    finally:
        assert server.stop() == 0


def test_a_link_out_of_the_folder_refuses_the_start_naming_it(tmp_path):
    folder, outside = tmp_path / "packs", tmp_path / "elsewhere"
    folder.mkdir()
    outside.mkdir()
    shutil.copy(PACK, outside / "moderation.json")
    (folder / "moderation.json").symlink_to(outside / "moderation.json")
    with pytest.raises(RuntimeError, match="exited while starting") as caught:
        ServerProcess(tmp_path / "run", "--packs", str(folder), "--no-official-packs", ready_s=90)
    assert "moderation.json: a link to a file outside the folder; not read" in str(caught.value)
    assert "not starting: the pack catalog has 1 error" in str(caught.value)
