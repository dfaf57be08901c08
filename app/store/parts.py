"""Values too large for one Memcached item, kept as parts with a manifest. No I/O here: this
is their layout; app/store/memcached.py writes and reads the items.

Memcached rejects items of 1 MiB or more, so a larger value is split into parts of
``part_bytes`` under ``<key>:<content id>:p<i>``, with a manifest under ``<key>`` holding the
part count, total length and a BLAKE2b digest. The part keys depend on the content, so two
writers of one key never mix their parts; a missing or mismatching part is a miss.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

DEFAULT_PART_BYTES = 900 * 1024  # under Memcached's 1 MiB item limit, key and header included


@dataclass(frozen=True)
class Manifest:
    """What the item under the value's own key holds: ``count`` parts, ``length`` bytes in
    all, and the value's ``digest``."""

    count: int
    length: int
    digest: str

    def to_bytes(self) -> bytes:
        return json.dumps({"n": self.count, "len": self.length, "h": self.digest}).encode()

    def part_keys(self, key: str) -> list[str]:
        return [f"{key}:{self.digest[:12]}:p{i}" for i in range(self.count)]

    def join(self, chunks: list[bytes]) -> bytes | None:
        """The value the parts make, or None when it is not the one the manifest describes
        (a part rewritten, or cut)."""
        value = b"".join(chunks)
        if len(value) != self.length or _digest(value) != self.digest:
            return None
        return value


def split(value: bytes, part_bytes: int) -> tuple[Manifest, list[bytes]]:
    """The manifest of ``value`` and its parts, in order."""
    count = -(-len(value) // part_bytes)
    chunks = [value[i * part_bytes : (i + 1) * part_bytes] for i in range(count)]
    return Manifest(count, len(value), _digest(value)), chunks


def read_manifest(data: bytes, max_count: int) -> Manifest | None:
    """The manifest ``data`` holds; None when it holds none, or one of more than
    ``max_count`` parts (more than the largest value that may be stored)."""
    try:
        doc = json.loads(data)
        manifest = Manifest(int(doc["n"]), int(doc["len"]), str(doc["h"]))
    except (ValueError, KeyError, TypeError):
        return None
    return manifest if 0 < manifest.count <= max_count else None


def _digest(value: bytes) -> str:
    return hashlib.blake2b(value, digest_size=16).hexdigest()
