"""Cache-affine routing (app/upstream/affinity.py): weighted rendezvous hashing keeps a key on
one upstream, shares keys by weight, moves only a leaving upstream's keys, treats a cache
group as one; a bounded load keeps a hot key within (1 + epsilon) times an upstream's share
of the calls in flight, spilling to its second choice before any other. The calls in flight
are the ledger's own count (app/upstream/ledger.py), and the plan an exchange makes carries
its routing (app/upstream/attempts.py)."""

from __future__ import annotations

import hashlib
import math
import random
from collections import Counter
from typing import Any

import pytest

from app.core.config import Settings
from app.core.errors import UpstreamReset
from app.observe.metrics import Metrics
from app.request import routes
from app.request.affinity import AFFINE, PREFIX, SESSION, SPILL, WEIGHTED, Affinity, Routing
from app.upstream.affinity import ordered, ranked_by
from app.upstream.breaker import BreakerPolicy
from app.upstream.catalog import UpstreamSpec, load
from app.upstream.exchange import Upstream
from app.upstream.ledger import Ledger
from app.upstream.transport import Transport, UpstreamRequest


def _spec(name: str, weight: float = 1.0, **kw: Any) -> UpstreamSpec:
    return UpstreamSpec(name, f"https://{name}.test/v1", weight=weight, **kw)


def _key(i: int) -> bytes:
    return hashlib.blake2b(str(i).encode(), digest_size=16).digest()


ANY = lambda name: True  # noqa: E731 every breaker closed


def _first_shares(specs: list[UpstreamSpec], keys: int) -> dict[str, float]:
    counts = Counter(ranked_by(_key(i), specs)[0].name for i in range(keys))
    return {name: n / keys for name, n in counts.items()}


@pytest.mark.parametrize(
    "weights", [(1, 1, 1), (3, 1), (2, 1, 1)], ids=["equal", "three-to-one", "two-one-one"]
)
def test_keys_are_shared_in_proportion_to_the_weights(weights: tuple[float, ...]) -> None:
    specs = [_spec(f"u{i}", w) for i, w in enumerate(weights)]
    shares = _first_shares(specs, 20_000)
    for spec in specs:
        assert shares[spec.name] == pytest.approx(spec.weight / sum(weights), abs=0.015)


def test_an_upstream_leaving_moves_only_its_own_keys_each_to_its_second_choice() -> None:
    specs = [_spec("a"), _spec("b"), _spec("c")]
    moved = 0
    for i in range(3000):
        before = ranked_by(_key(i), specs)
        after = ranked_by(_key(i), [s for s in specs if s.name != "b"])
        if before[0].name == "b":
            assert after[0] is before[1]
            moved += 1
        else:
            assert after[0] is before[0]
    assert 800 < moved < 1200  # about a third were b's


def test_the_upstreams_of_one_cache_group_are_scored_as_one_and_follow_each_other() -> None:
    group = [_spec("a1", cache_group="org"), _spec("a2", cache_group="org")]
    specs = [*group, _spec("b", 2.0)]
    firsts: Counter[str] = Counter()
    for i in range(4000):
        order = [s.name for s in ranked_by(_key(i), specs)]
        assert order.index("a1") - order.index("a2") in (-1, 1)  # never b between them
        firsts[order[0]] += 1
    assert firsts["b"] / 4000 == pytest.approx(0.5, abs=0.03)  # weights 1 + 1 against 2
    assert firsts["a1"] / 4000 == pytest.approx(0.25, abs=0.03)
    # Without a group, the base URL and the key make it: two keys are two accounts.
    same_url = _spec("k1", key="sk-1"), UpstreamSpec("k2", "https://k1.test/v1", key="sk-2")
    assert same_url[0].group != same_url[1].group
    assert UpstreamSpec("k3", "https://k1.test/v1", key="sk-1").group == same_url[0].group
    assert "sk-1" not in same_url[0].group


def _cap(total: int, weight: float, weights: float, epsilon: float) -> int:
    return math.ceil((1 + epsilon) * total * weight / weights - 1e-9)


@pytest.mark.parametrize("weights", [(1, 1, 1), (2, 1, 1)], ids=["equal", "weighted"])
@pytest.mark.parametrize("epsilon", [0.25, 0.0, 1.0])
def test_a_hot_prefix_from_100_sessions_never_takes_more_than_its_bounded_share(
    weights: tuple[float, ...], epsilon: float
) -> None:
    """100 sessions of one prefix arrive while the others are in flight: each upstream
    holds at most (1 + epsilon) times its weighted share of the calls in flight at every
    moment, and the key's choices fill in its order: its first until full, then its
    second, a third only when the second is full too."""
    specs = [_spec(f"u{i}", w) for i, w in enumerate(weights)]
    hot, flying = _key(7), Counter[str]()
    rank = [s.name for s in ranked_by(hot, specs)]
    reasons = []
    for _ in range(100):
        order, reason = ordered(specs, None, hot, allowed=ANY, load=flying, epsilon=epsilon)
        first = order[0].name
        # The first with room; everything before it in the key's order was full.
        assert [s.name for s in order[1:]] == [n for n in rank if n != first]
        flying[first] += 1
        reasons.append(reason)
        total = sum(flying.values())
        for spec in specs:
            assert flying[spec.name] <= _cap(total, spec.weight, sum(weights), epsilon)
    assert reasons[0] == AFFINE
    first_share = (1 + epsilon) * specs[int(rank[0][1:])].weight / sum(weights)
    assert (SPILL in reasons) is (first_share < 1)  # a share of all of them never spills
    used = [n for n in rank if flying[n]]
    assert used == rank[: len(used)]  # spilled in the key's order, never skipping one
    assert flying[rank[0]] >= flying[rank[-1]]


def test_a_call_goes_only_where_it_fits_as_calls_come_and_go() -> None:
    rng = random.Random(4)
    specs = [_spec("a", 2.0), _spec("b"), _spec("c")]
    flying = Counter[str]()
    keys = [_key(i) for i in range(3)]  # a few hot conversations
    for _ in range(3000):
        if sum(flying.values()) and rng.random() < 0.45:
            gone = rng.choice(sorted(flying.elements()))
            flying[gone] -= 1
            continue
        key = rng.choice(keys)
        order, _ = ordered(specs, None, key, allowed=ANY, load=flying, epsilon=0.25)
        taker = order[0]
        flying[taker.name] += 1
        # The one that took it is within its bound of what is in flight now (calls that
        # left since may leave another above its own until its next calls go elsewhere).
        assert flying[taker.name] <= _cap(sum(flying.values()), taker.weight, 4.0, 0.25)


def test_priorities_breakers_and_models_come_before_the_key() -> None:
    specs = [
        _spec("p0a"),
        _spec("p0b"),
        _spec("p1", priority=1),
        _spec("other", models=("x",)),
    ]
    for i in range(200):
        order, _ = ordered(specs, "m", _key(i), allowed=ANY, load={}, epsilon=0.25)
        assert {s.name for s in order[:2]} == {"p0a", "p0b"} and order[2].name == "p1"
        closed = lambda name: name != "p0a"  # noqa: E731
        order, _ = ordered(specs, "m", _key(i), allowed=closed, load={}, epsilon=0.25)
        assert [s.name for s in order] == ["p0b", "p1"]
    panic, _ = ordered(specs, "m", _key(1), allowed=lambda n: False, load={}, epsilon=0.25)
    assert {s.name for s in panic} == {"p0a", "p0b", "p1"}  # all tried: the panic threshold


# -- the worker's calls in flight ----------------------------------------------------------
class Raw:
    def __init__(self, status: int = 200) -> None:
        self.status, self.closed = status, False
        self.headers: dict[str, str] = {}

    def close(self) -> None:
        self.closed = True

    def release_conn(self) -> None:
        pass


def test_an_attempt_is_in_flight_from_its_start_until_its_answer_is_done() -> None:
    metrics = Metrics(multiproc_dir="")
    ledger = Ledger(["a", "b"], BreakerPolicy(), lambda: 0.0, Transport(Settings()), metrics)
    failed, judged, read, broken = (ledger.start(n) for n in ("a", "a", "b", "b"))
    assert ledger.in_flight == {"a": 2, "b": 2}
    ledger.failed(failed)  # no answer
    ledger.at_headers(judged, 503)  # an error answer: judged at its headers, done with
    assert ledger.in_flight["a"] == 0
    ledger.at_headers(read, 200)
    ledger.at_headers(broken, 200)
    answers = [ledger.answered(Raw(), 1, a, None) for a in (read, broken)]  # type: ignore[arg-type]
    assert ledger.in_flight["b"] == 2  # a 2xx is in flight while its body is read
    ledger.broken(answers[1], UpstreamReset("cut"))
    assert ledger.in_flight["b"] == 2  # broken, not yet let go
    for answer in answers + answers:  # each closed twice: counted out once
        ledger.close(answer)
    assert ledger.in_flight == {"a": 0, "b": 0}
    cancelled = ledger.start("a")
    ledger.cancelled(cancelled)
    judged = ledger.start("a")
    ledger.at_headers(judged, 429)
    resp = ledger.answered(Raw(429), 1, judged, None)  # type: ignore[arg-type]
    ledger.broken(resp, UpstreamReset("cut"))  # after its verdict: nothing more
    ledger.close(resp)
    assert ledger.in_flight == {"a": 0, "b": 0}


def _route(upstream: Upstream, affinity: Affinity | None) -> tuple[list[str], Routing | None]:
    req = UpstreamRequest(
        "POST",
        "/chat/completions",
        "",
        {},
        b"{}",
        False,
        model="m",
        route=routes.CHAT,
        affinity=affinity,
    )
    order, routing = upstream.attempts.route(req)
    return [s.name for s in order], routing


def test_the_plan_follows_the_key_the_calls_in_flight_and_the_setting() -> None:
    specs = load(
        "\n".join(f'[[upstreams]]\nname = "{n}"\nbase_url = "https://{n}.test/v1"' for n in "abc"),
        {},
    )
    upstream = Upstream(Settings(routing_epsilon=0.0), specs)
    key = Affinity(_key(3), SESSION)
    expected = [s.name for s in ranked_by(key.key, specs)]
    order, routing = _route(upstream, key)
    assert order == expected and routing == Routing(expected[0], AFFINE, SESSION)
    # Its first choice holds its exact share of what is in flight: the next one takes it.
    upstream.ledger.in_flight[expected[0]] = 1
    order, routing = _route(upstream, key)
    assert order[0] == expected[1] and routing == Routing(expected[1], SPILL, SESSION)
    # No key: by weight at random, and so for every call with LLMGATE_ROUTING=weighted.
    order, routing = _route(upstream, None)
    assert routing == Routing(order[0], WEIGHTED, None)
    weighted = Upstream(Settings(routing="weighted"), specs, rand=lambda: 0.0)
    order, routing = _route(weighted, Affinity(_key(3), PREFIX))
    assert order == ["a", "b", "c"] and routing == Routing("a", WEIGHTED, None)
