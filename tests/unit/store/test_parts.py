"""The layout of a value split into parts (app/store/parts.py), without Memcached: what the
manifest says, which keys the parts go under, and which manifests and parts are refused. The
items on a real node: tests/integration/test_cache_backends.py."""

from __future__ import annotations

import hashlib
import json

import pytest

from app.store.parts import Manifest, read_manifest, split

VALUE = bytes(range(256)) * 10  # 2,560 bytes: parts of 1,000, 1,000 and 560


def test_a_value_splits_into_parts_its_manifest_describes() -> None:
    manifest, chunks = split(VALUE, 1000)
    digest = hashlib.blake2b(VALUE, digest_size=16).hexdigest()
    assert [len(c) for c in chunks] == [1000, 1000, 560] and b"".join(chunks) == VALUE
    assert manifest == Manifest(3, len(VALUE), digest)
    assert json.loads(manifest.to_bytes()) == {"n": 3, "len": 2560, "h": digest}
    assert manifest.part_keys("k") == [f"k:{digest[:12]}:p{i}" for i in range(3)]
    assert read_manifest(manifest.to_bytes(), max_count=3) == manifest
    assert manifest.join(chunks) == VALUE


def test_a_value_of_whole_parts_has_no_empty_last_part() -> None:
    manifest, chunks = split(VALUE, 1280)
    assert manifest.count == 2 and [len(c) for c in chunks] == [1280, 1280]


def test_two_values_of_one_key_never_share_a_part_key() -> None:
    one, _ = split(VALUE, 1000)
    other, _ = split(VALUE[::-1], 1000)
    assert not set(one.part_keys("k")) & set(other.part_keys("k"))


@pytest.mark.parametrize(
    "data",
    [
        b"not json",
        b"\xff\xfe",
        b'["n", "len", "h"]',
        b'{"n": 2, "len": 10}',
        b'{"n": "two", "len": 10, "h": "ab"}',
        b'{"n": 0, "len": 0, "h": "ab"}',
        b'{"n": -1, "len": 10, "h": "ab"}',
        b'{"n": 4, "len": 10, "h": "ab"}',  # more parts than the largest value has
    ],
)
def test_a_manifest_that_is_not_one_is_refused(data: bytes) -> None:
    assert read_manifest(data, max_count=3) is None


def test_parts_that_do_not_make_the_value_are_refused() -> None:
    manifest, chunks = split(VALUE, 1000)
    rewritten = [chunks[0], b"z" * len(chunks[1]), chunks[2]]  # same length, other bytes
    assert manifest.join(rewritten) is None
    assert manifest.join(chunks[:2]) is None  # the last part missing: short
    assert manifest.join([*chunks, b"x"]) is None  # longer
