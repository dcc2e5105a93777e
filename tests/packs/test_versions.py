"""Version order and the default version (packs spec §1.2)."""

from __future__ import annotations

import pytest

from spinf.packs.versions import UnorderableVersions, compare, default_version, newest_first


def test_number_parts_compare_as_integers_and_a_prefix_is_older():
    assert newest_first(["1.9.0", "1.10.0", "1.0", "1.0.0", "0.1.3", "1.0.0-31b", "2+x"]) == [
        "2+x",
        "1.10.0",
        "1.9.0",
        "1.0.0-31b",
        "1.0.0",
        "1.0",
        "0.1.3",
    ]


def test_text_parts_compare_as_strings():
    assert compare("1.0.rc2", "1.0.rc10") > 0  # "rc2" > "rc10" as strings
    assert compare("1.0.beta", "1.0.alpha") > 0 and compare("1.0", "1.0") == 0


def test_a_number_meeting_a_text_cannot_be_ordered():
    with pytest.raises(UnorderableVersions, match=r"'1\.0\.1' and '1\.0\.rc1' cannot be ordered"):
        newest_first(["1.0.1", "2.0.0", "1.0.rc1"])
    assert newest_first(["1.0.1", "2.0.rc1"]) == ["2.0.rc1", "1.0.1"]  # the first parts differ: ordered


def test_the_default_version():
    versions = [("2.0.0", "coming_soon"), ("1.0.0", "deprecated"), ("1.1.0", "available")]
    assert default_version(versions, listed=True) == "1.1.0"
    assert default_version(versions[:2], listed=True) == "2.0.0"  # none available: the first listed
    assert default_version([("1.9.0", "available"), ("1.10.0", "available")], listed=False) == "1.10.0"
