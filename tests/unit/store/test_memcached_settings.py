"""LLMGATE_MEMCACHED_RETRY_S reaches both users of Memcached: the answer cache and the gateway
keys' limit counters (each builds its own client; nothing is connected until first use)."""

from __future__ import annotations

import pytest

from app.cache import build_answer_cache
from app.cache.tiered import TieredCache
from app.core.config import Settings, SettingsError
from app.factory import build_access
from app.observe.metrics import Metrics
from app.store.counters import MemcachedCounters
from app.store.memcached import MemcachedBackend
from app.tenancy.keyring import hash_key


def _settings(**env: str) -> Settings:
    return Settings.from_env({"LLMGATE_MEMCACHED": "127.0.0.1:11211", **env})


def test_the_retry_setting_reaches_the_cache_and_the_limit_counters(tmp_path) -> None:
    keys = tmp_path / "keys.toml"
    keys.write_text(f'[[keys]]\nname = "k"\nsha256 = "{hash_key("sk-k")}"\n')
    for retry_s, expected in ((None, 10.0), ("2.5", 2.5)):
        env = {"LLMGATE_KEYS_FILE": str(keys)}
        if retry_s is not None:
            env["LLMGATE_MEMCACHED_RETRY_S"] = retry_s
        settings = _settings(**env)
        cache = build_answer_cache(settings, Metrics(multiproc_dir=""))
        access = build_access(settings, Metrics(multiproc_dir=""))
        assert cache is not None and access is not None
        assert isinstance(cache.tiers, TieredCache)
        assert isinstance(access.counters, MemcachedCounters)
        for backend in (cache.tiers.l2, access.counters.memcached):
            assert isinstance(backend, MemcachedBackend)
            assert backend._breaker.dead_timeout == expected


@pytest.mark.parametrize("value", ["0", "-1"])
def test_a_retry_time_that_is_not_positive_stops_the_start(value: str) -> None:
    with pytest.raises(SettingsError, match="LLMGATE_MEMCACHED_RETRY_S"):
        _settings(LLMGATE_MEMCACHED_RETRY_S=value).validate()
