"""Settings: parsing, validation, and the rule that every setting is documented."""

from __future__ import annotations

import dataclasses
import re

import pytest

from app.core.config import Settings, SettingsError, documented_settings
from tests.conftest import ROOT


def test_defaults_match_the_timeout_model() -> None:
    s = Settings()
    assert s.connect_timeout_s == 5.0
    assert s.idle_timeout_s >= 120.0
    assert s.heartbeat_s == 15.0
    assert s.deadline_s >= s.first_byte_timeout_s


def test_from_env_parses_types() -> None:
    s = Settings.from_env(
        {
            "LLMGATE_UPSTREAM_URL": "http://127.0.0.1:9/v1",
            "LLMGATE_POOL_SIZE": "16",
            "LLMGATE_IDLE_TIMEOUT_S": "2.5",
            "LLMGATE_MEMCACHED": "127.0.0.1:11211, [::1]:11212",
            "UNRELATED": "x",
        }
    )
    assert (s.pool_size, s.idle_timeout_s) == (16, 2.5)
    assert s.memcached_nodes == [("127.0.0.1", 11211), ("::1", 11212)]


@pytest.mark.parametrize(
    "env",
    [
        {"LLMGATE_POOL_SIZE": "many"},
        {"LLMGATE_POOL_SIZE": "0"},
        {"LLMGATE_POOL_SPARE_RATIO": "-0.1"},
        {"LLMGATE_POOL_SPARE_RATIO": "2"},
        {"LLMGATE_UPSTREAM_URL": "ftp://example.com"},
        {"LLMGATE_IDLE_TIMEOUT_S": "0"},
        {"LLMGATE_DEADLINE_S": "soon"},
        {"LLMGATE_CACHE_L1_BYTES": "10"},
        {"LLMGATE_LOG_MEMORY_BYTES": "-1"},
        {"LLMGATE_CACHE_MODE": "sometimes"},
    ],
)
def test_bad_values_are_refused_with_the_variable_named(env: dict[str, str]) -> None:
    with pytest.raises(SettingsError, match="LLMGATE_"):
        Settings.from_env(env)


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("LLMGATE_HEARTBEAT_S", "-5", "must be >= 0, got -5.0"),
        ("LLMGATE_RETRY_BACKOFF_S", "-0.5", "must be >= 0, got -0.5"),
        ("LLMGATE_RETRY_BACKOFF_MAX_S", "-1", "must be >= 0, got -1.0"),
        ("LLMGATE_RETRY_AFTER_MAX_S", "-1", "must be >= 0, got -1.0"),
        ("LLMGATE_CACHE_TTL_JITTER_S", "-1", "must be >= 0, got -1"),
        ("LLMGATE_CACHE_LEASE_S", "-30", "must be >= 0, got -30.0"),
        ("LLMGATE_CACHE_EARLY_REFRESH_BETA", "-1", "must be >= 0, got -1.0"),
        ("LLMGATE_CACHE_TTL_S", "0", "must be > 0, got 0"),
        ("LLMGATE_CACHE_L1_TTL_S", "0", "must be > 0, got 0"),
        ("LLMGATE_CACHE_MAX_ENTRY_BYTES", "-1", "must be > 0, got -1"),
        ("LLMGATE_MEMCACHED_TIMEOUT_S", "0", "must be > 0, got 0.0"),
        ("LLMGATE_MEMCACHED_CONNECT_TIMEOUT_S", "-1", "must be > 0, got -1.0"),
        ("LLMGATE_DEADLINE_S", "nan", "must be a finite number, got nan"),
        ("LLMGATE_IDLE_TIMEOUT_S", "inf", "must be a finite number, got inf"),
        ("LLMGATE_HEARTBEAT_S", "1e999", "must be a finite number, got inf"),
    ],
)
def test_nonsense_numbers_are_refused_with_the_value(name: str, value: str, message: str) -> None:
    """Values that used to pass: a negative heartbeat or lease was taken as off, an L1 TTL
    of 0 failed each worker's boot, nan passed every comparison."""
    with pytest.raises(SettingsError) as caught:
        Settings.from_env({name: value})
    assert str(caught.value) == f"{name} {message}"


def test_zero_stays_allowed_where_it_means_off() -> None:
    off = ("HEARTBEAT_S", "RETRY_BACKOFF_S", "RETRY_AFTER_MAX_S", "CACHE_TTL_JITTER_S",
           "CACHE_LEASE_S", "CACHE_EARLY_REFRESH_BETA")  # fmt: skip
    settings = Settings.from_env({f"LLMGATE_{name}": "0" for name in off})
    assert settings.heartbeat_s == settings.cache_lease_s == 0


def test_bad_memcached_entry() -> None:
    with pytest.raises(SettingsError):
        _ = Settings(memcached="localhost").memcached_nodes


def test_settings_are_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        Settings().pool_size = 3  # type: ignore[misc]


@pytest.mark.parametrize("doc", ["README.md", "docs/configuration.md"])
def test_every_setting_is_documented(doc: str) -> None:
    text = (ROOT / doc).read_text()
    missing = [env for env, _, _ in documented_settings() if f"`{env}`" not in text]
    assert not missing, f"{doc} does not document {missing}"


def test_memcached_dns_entries_are_kept_apart_from_fixed_nodes() -> None:
    s = Settings(memcached="10.0.0.1:11211, dns+memcached:11211,dns+mc.ns.svc:11311")
    assert s.memcached_nodes == [("10.0.0.1", 11211)]
    assert s.memcached_dns == [("memcached", 11211), ("mc.ns.svc", 11311)]
    for bad in ("dns+memcached", "dns+:11211"):
        with pytest.raises(SettingsError, match="dns\\+name:port"):
            Settings.from_env({"LLMGATE_MEMCACHED": bad})
    with pytest.raises(SettingsError, match="LLMGATE_MEMCACHED_DNS_REFRESH_S"):
        Settings.from_env({"LLMGATE_MEMCACHED_DNS_REFRESH_S": "0"})


def test_the_pool_keeps_a_connection_for_every_stream_a_worker_may_hold() -> None:
    assert Settings.from_env({}).pool_size == Settings.from_env({}).max_streams_per_worker
    assert Settings.from_env({"LLMGATE_WORKER_CONNECTIONS": "1000"}).pool_size == 400
    assert Settings.from_env({"LLMGATE_MAX_STREAMS_PER_WORKER": "300"}).pool_size == 300
    assert Settings.from_env({"LLMGATE_POOL_SIZE": "7"}).pool_size == 7
    no_limits = {"LLMGATE_MAX_STREAMS_PER_WORKER": "0", "LLMGATE_MAX_REQUESTS_PER_WORKER": "0"}
    assert Settings.from_env(no_limits).pool_size == 100


def test_the_ledger_settings() -> None:
    assert Settings.from_env({}).ledger == ""
    assert Settings.from_env({"LLMGATE_LEDGER_URL": " OFF "}).ledger == ""
    url = "postgresql://spend:pw@db:5432/llmgate"
    assert Settings.from_env({"LLMGATE_LEDGER_URL": url}).ledger == url
    assert Settings.from_env({"LLMGATE_LEDGER_URL": "/var/spend.db"}).ledger == "/var/spend.db"
    bad = [
        ({"LLMGATE_LEDGER_URL": "mysql://db/x"}, "LLMGATE_LEDGER_URL must be"),
        ({"LLMGATE_LEDGER_FLUSH_S": "0"}, "LLMGATE_LEDGER_FLUSH_S"),
        ({"LLMGATE_LEDGER_READ_TIMEOUT_S": "-1"}, "LLMGATE_LEDGER_READ_TIMEOUT_S"),
        ({"LLMGATE_LEDGER_BATCH": "0"}, "LLMGATE_LEDGER_BATCH must be >= 1"),
        ({"LLMGATE_LEDGER_BATCH": "100", "LLMGATE_LEDGER_QUEUE": "99"}, "<= LLMGATE_LEDGER_QUEUE"),
        ({"LLMGATE_LEDGER_RETENTION_DAYS": "31"}, "at least 32, got 31"),
    ]
    for env, words in bad:
        with pytest.raises(SettingsError, match=re.escape(words)):
            Settings.from_env(env)
    assert Settings.from_env({"LLMGATE_LEDGER_RETENTION_DAYS": "0"}).ledger_retention_days == 0
