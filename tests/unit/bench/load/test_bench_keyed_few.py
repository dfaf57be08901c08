"""bench/load/keyed_few.py: the keys file holds the limited key and one without limits, and a
Server-Timing stage is read from each answer's header, 0 where an answer has none."""

from __future__ import annotations

import tomllib
from pathlib import Path

from app.tenancy.keyring import hash_key
from bench.load import keyed_few


def test_the_keys_file_has_a_limited_key_and_a_bare_one(tmp_path: Path) -> None:
    keys = tomllib.loads(keyed_few._keys(tmp_path).read_text())["keys"]
    by_hash = {key["sha256"]: key for key in keys}
    limited, bare = by_hash[hash_key(keyed_few.SECRET)], by_hash[hash_key(keyed_few.BARE)]
    assert {"requests_per_minute", "tokens_per_minute", "tokens_per_day", "max_streams"} <= set(
        limited
    )
    assert set(bare) == {"name", "sha256"}


def test_a_stage_is_the_median_over_the_answers() -> None:
    kept = [
        (0.01, "queue;dur=0.9, auth;dur=0.3, work;dur=0.2, gateway;dur=1.5"),
        (0.01, "queue;dur=1.1, auth;dur=2.5, work;dur=0.1, gateway;dur=3.9"),
        (0.01, "queue;dur=0.2, work;dur=0.3, gateway;dur=0.6"),  # no key: no auth stage
    ]
    assert keyed_few._stage(kept, "auth") == 0.3
    assert keyed_few._stage(kept, "work") == 0.2
    assert keyed_few._stage([], "auth") == 0.0


def test_a_ratio_is_the_median_of_the_rounds_pairs_with_memcacheds_cpu_in_the_keyed_one() -> None:
    # (p50 ms, calls/s, µs CPU, Memcached µs, auth ms, busy) a round
    seen: dict[str, list[keyed_few.Row]] = {
        "keyed": [
            (2.0, 100.0, 150.0, 50.0, 1, 1),
            (20.0, 50.0, 300.0, 100.0, 1, 1),
            (3.0, 900.0, 100.0, 0.0, 1, 1),
        ],
        "no key": [
            (1.0, 100.0, 100.0, 0.0, 0, 1),
            (2.0, 100.0, 200.0, 0.0, 0, 1),
            (3.0, 1000.0, 100.0, 0.0, 0, 1),
        ],
    }
    p50, rate, cpu = keyed_few.ratios(seen, "keyed")
    assert (p50, rate, cpu) == (2.0, 0.9, 2.0)  # rounds 2, 10, 1; 1, 0.5, 0.9; 2, 2, 1
