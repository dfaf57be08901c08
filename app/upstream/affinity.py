"""The order of a call's upstreams by its affinity key: the same conversation to the same
upstream while it is healthy, within a bounded load. No I/O here.

Among the upstreams of one priority that serve the call and whose breakers let it through:

- **Weighted rendezvous hashing** (highest random weight): each upstream scores
  ``-weight / ln(h)``, ``h`` a hash of the key and the upstream mapped into (0, 1); the
  highest score comes first. Over many keys each upstream comes first in proportion to its
  weight, and an upstream leaving the set (its breaker opens) moves only the keys it had,
  each to its own next choice; the others keep theirs. Upstreams that share a provider's
  prompt cache (one ``cache_group``) are scored as one, with their weights together, and
  follow one another: a key's warm cache is its group's.
- **Bounded load** (consistent hashing with bounded loads): with ``total`` calls in
  flight among these upstreams, an upstream of
  weight ``w`` out of ``W`` may take the call only while it has fewer than
  ``ceil((1 + epsilon) * (total + 1) * w / W)`` in flight; else the key's next choice that
  has room takes it. The caps add up to more than the calls, so one always has room; a hot
  key spills to its second choice, then its third, never to all at once. The counts are the
  worker's own (app/upstream/ledger.py): the bound holds in each worker, and over N workers
  an upstream has at most ``(1 + epsilon)`` times its share of all calls in flight plus
  ``2 N`` (each worker's ceiling and its own new call).

The order is the plan: failover and a hedge's backup go to the next upstream of it, the
key's second choice (app/upstream/attempts.py, app/upstream/exchange.py). Cost: one BLAKE2b
of 8 bytes and a logarithm per upstream of the call's model.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Mapping, Sequence

from app.request.affinity import AFFINE, SPILL
from app.upstream.catalog import UpstreamSpec

_SCALE = float(1 << 64)
_SLACK = 1e-9  # a cap that is a whole number in exact arithmetic stays one in floats


def ordered(
    specs: Sequence[UpstreamSpec],
    model: str | None,
    key: bytes,
    *,
    allowed: Callable[[str], bool],
    load: Mapping[str, int],
    epsilon: float,
) -> tuple[list[UpstreamSpec], str]:
    """The upstreams to try for ``model`` in ``key``'s order (best priority first), and why
    the first is first: ``affine`` (the key's first choice) or ``spill`` (its first had its
    share in flight). ``specs``: those that speak the call's route; ``load``: calls in
    flight by upstream name."""
    serving = [s for s in specs if s.serves(model)]
    usable = [s for s in serving if allowed(s.name)] or serving  # panic: try them all
    out: list[UpstreamSpec] = []
    reason = AFFINE
    for priority in sorted({s.priority for s in usable}):
        ranked = ranked_by(key, [s for s in usable if s.priority == priority])
        if not out:
            first = _with_room(ranked, load, epsilon)
            if first is not ranked[0]:
                reason = SPILL
                ranked.remove(first)
                ranked.insert(0, first)
        out += ranked
    return out, reason


def ranked_by(key: bytes, group: Sequence[UpstreamSpec]) -> list[UpstreamSpec]:
    """``group`` in ``key``'s rendezvous order: its cache groups by score (their weights
    together), each group's upstreams by their own."""
    members: dict[str, list[UpstreamSpec]] = {}
    for spec in group:
        members.setdefault(spec.group, []).append(spec)
    scored = sorted(
        members.items(),
        key=lambda item: _score(key, item[0], sum(s.weight for s in item[1])),
        reverse=True,
    )
    out: list[UpstreamSpec] = []
    for name, specs in scored:
        if len(specs) > 1:
            specs = sorted(specs, key=lambda s: _score(key, name + "/" + s.name, s.weight))
            specs.reverse()
        out += specs
    return out


def _score(key: bytes, name: str, weight: float) -> float:
    """Weighted rendezvous: ``-weight / ln(h)``, ``h`` in (0, 1) from the key and ``name``."""
    digest = hashlib.blake2b(key + name.encode(), digest_size=8).digest()
    h = (int.from_bytes(digest, "big") + 0.5) / _SCALE
    return -weight / math.log(h)


def _with_room(ranked: list[UpstreamSpec], load: Mapping[str, int], epsilon: float) -> UpstreamSpec:
    """The first of ``ranked`` below its bounded share of the calls in flight, the new one
    counted (the module's rule)."""
    total = sum(load.get(s.name, 0) for s in ranked) + 1
    weights = sum(s.weight for s in ranked)
    for spec in ranked:
        cap = math.ceil((1 + epsilon) * total * spec.weight / weights - _SLACK)
        if load.get(spec.name, 0) + 1 <= cap:
            return spec
    return ranked[0]  # not reached: the caps add up to more than ``total``
