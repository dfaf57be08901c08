"""Cache controls, TTLs and XFetch edges the mutation run found untested (app/cache/policy.py).

Expected values: RFC 9111 5.2 (Cache-Control directives: `max-age=N` with N delta-seconds,
in token or quoted-string form; malformed directives ignored), the README's table (`ttl: 0`
means do not store; namespaces of 1-64 characters) and XFetch's formula (Vattani et al.:
refresh when ``now - compute * beta * ln(rand) >= expiry``).
"""

from __future__ import annotations

import json
import math

import pytest

from app.cache import policy
from app.core.errors import BadRequest

NOT_SECONDS = "expected seconds >= 0."


def _error(controls: object) -> dict:
    with pytest.raises(BadRequest) as caught:
        policy.apply_body_controls(policy.Directive(), controls)
    assert caught.value.status == 400
    return caught.value.to_body()["error"]


# --- Cache-Control header -----------------------------------------------------------------


def test_a_quoted_max_age_counts_like_a_token() -> None:
    # RFC 9111 5.2: an argument may be sent as a token or as a quoted-string.
    assert policy.parse_cache_control(['max-age="60"']).ttl == 60
    assert policy.parse_cache_control(['s-maxage="5"']).max_age == 5.0


@pytest.mark.parametrize("value", ["max-age=X60", "max-age=60X", "max-age=6 0", "max-age=-1"])
def test_a_malformed_max_age_is_ignored(value: str) -> None:
    assert policy.parse_cache_control([value]) == policy.Directive()


def test_max_age_of_one_second_is_stored_for_one_second() -> None:
    directive = policy.parse_cache_control(["max-age=1"])
    assert (directive.ttl, directive.store) == (1, True)
    assert policy.entry_ttl(directive, 3600, 360, rand=lambda: 0.0) == 1


@pytest.mark.parametrize(
    ("arg", "ttl"),
    [
        ("0" * 20 + "5", 5),  # leading zeros do not count toward the length
        ("0" * 5000, 0),
        (str(policy.MAX_TTL_S + 1), policy.MAX_TTL_S),
        ("9" * 5000, policy.MAX_TTL_S),  # longer than int() takes: still not an error
    ],
)
def test_max_age_is_delta_seconds_of_any_length(arg: str, ttl: int) -> None:
    # RFC 9111 1.2.2: a delta-seconds too large to represent counts as the largest the cache
    # can; here, the longest TTL Memcached keeps.
    directive = policy.parse_cache_control([f"max-age={arg}"])
    assert (directive.ttl, directive.store) == (ttl, ttl > 0)


# --- LiteLLM's body object --------------------------------------------------------------


def test_ttl_zero_is_accepted_and_means_do_not_store() -> None:
    directive = policy.apply_body_controls(policy.Directive(), {"ttl": 0})
    assert (directive.ttl, directive.store) == (0, False)


def test_ttl_one_is_stored() -> None:
    directive = policy.apply_body_controls(policy.Directive(), {"ttl": 1})
    assert (directive.ttl, directive.store) == (1, True)


def test_a_fractional_ttl_below_one_second_is_not_stored_but_is_valid() -> None:
    directive = policy.apply_body_controls(policy.Directive(), {"ttl": 0.5})
    assert (directive.ttl, directive.store) == (0, False)


def test_s_maxage_zero_accepts_only_a_fresh_entry() -> None:
    directive = policy.apply_body_controls(policy.Directive(), {"s-maxage": 0})
    assert directive.max_age == 0.0
    assert policy.acceptable_age(directive, 0.0) and not policy.acceptable_age(directive, 0.5)


def test_a_namespace_of_64_characters_is_the_longest_accepted() -> None:
    name = "n" * 64
    assert policy.apply_body_controls(policy.Directive(), {"namespace": name}).namespace == name
    assert _error({"namespace": name + "n"})["param"] == "cache"


@pytest.mark.parametrize(
    ("controls", "message"),
    [
        ("yes", "Invalid value for 'cache': expected an object."),
        ({"ttl": -1}, f"Invalid cache control 'ttl': {NOT_SECONDS}"),
        ({"ttl": True}, f"Invalid cache control 'ttl': {NOT_SECONDS}"),
        # JSON's 1e999 parses as infinity, and NaN is accepted by json.loads: neither is seconds.
        ({"ttl": json.loads("1e999")}, f"Invalid cache control 'ttl': {NOT_SECONDS}"),
        ({"s-maxage": json.loads("NaN")}, f"Invalid cache control 's-maxage': {NOT_SECONDS}"),
        ({"s-maxage": "3"}, f"Invalid cache control 's-maxage': {NOT_SECONDS}"),
        ({"namespace": ""}, "Invalid cache 'namespace': 1-64 characters."),
        ({"namespace": 7}, "Invalid cache 'namespace': 1-64 characters."),
    ],
)
def test_malformed_body_controls_name_the_cache_parameter(controls: object, message: str) -> None:
    assert _error(controls) == {
        "message": message,
        "type": "invalid_request_error",
        "param": "cache",
        "code": "invalid_request",
    }


def test_a_namespace_the_operator_did_not_allow_is_a_clear_400() -> None:
    with pytest.raises(BadRequest) as caught:
        policy.check_namespace(policy.Directive(namespace="team"), frozenset({"docs"}))
    assert caught.value.to_body()["error"] == {
        "message": "Cache namespace 'team' is not allowed on this gateway "
        "(LLMGATE_CACHE_NAMESPACES).",
        "type": "invalid_request_error",
        "param": "cache",
        "code": "cache_namespace_not_allowed",
    }


# --- TTL ------------------------------------------------------------------------------------


def test_the_shortest_lifetime_is_one_second() -> None:
    # Memcached reads 0 as "never expires": the floor is 1 s, not more.
    assert policy.entry_ttl(policy.Directive(), 1, 0, rand=lambda: 0.0) == 1
    assert policy.entry_ttl(policy.Directive(), 0, 0, rand=lambda: 0.0) == 1
    assert policy.entry_ttl(policy.Directive(ttl=0), 3600, 0) == 1


# --- XFetch ---------------------------------------------------------------------------------


def test_beta_zero_is_off_even_at_expiry() -> None:
    for now in (999.0, 1000.0, 1001.0):
        assert not policy.refresh_early(
            now=now, expires=1000.0, compute_s=10.0, beta=0.0, rand=lambda: 0.5
        )


def test_beta_scales_the_early_window() -> None:
    # Window = compute * beta * -ln(rand): 10 s * 2 * ln 2 = 13.86 s before expiry.
    window = 10.0 * 2.0 * math.log(2.0)

    def due(now: float) -> bool:
        return policy.refresh_early(
            now=now, expires=1000.0, compute_s=10.0, beta=2.0, rand=lambda: 0.5
        )

    assert due(1000.0 - window + 0.01) and not due(1000.0 - window - 0.01)
