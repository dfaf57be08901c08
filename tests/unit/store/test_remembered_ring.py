"""``RememberedRing`` (app/store/guarded_client.py): pymemcache's rendezvous hashing, each
key's node remembered. It must name the node pymemcache's own ring names, for every key and
after every change of nodes, or two workers would count one limit in two places."""

from __future__ import annotations

from pymemcache.client.rendezvous import RendezvousHash

from app.store.guarded_client import RememberedRing

KEYS = [f"llmgate:rl:v1:team-{i}:requests:{60 * i}" for i in range(300)]


def _rings(nodes: list[str]) -> tuple[RememberedRing, RendezvousHash]:
    ours, theirs = RememberedRing(), RendezvousHash()
    for node in nodes:
        ours.add_node(node)
        theirs.add_node(node)
    return ours, theirs


def test_every_key_gets_pymemcaches_node_as_the_ring_changes() -> None:
    ours, theirs = _rings(["10.0.0.1:11211", "10.0.0.2:11211"])
    for change in (None, ("add", "10.0.0.3:11211"), ("remove", "10.0.0.1:11211")):
        if change is not None:
            for ring in (ours, theirs):
                getattr(ring, f"{change[0]}_node")(change[1])
        for _ in range(2):  # asked, then remembered
            assert [ours.get_node(k) for k in KEYS] == [theirs.get_node(k) for k in KEYS]
    assert len({ours.get_node(k) for k in KEYS}) == 2  # the keys are spread: a real test


def test_a_remembered_key_is_not_hashed_again_and_an_empty_ring_is_not_remembered() -> None:
    ring = RememberedRing()
    assert ring.get_node(KEYS[0]) is None
    ring.add_node("10.0.0.1:11211")
    hashed = []
    score = ring.hash_function

    def counted(text: str) -> int:
        hashed.append(text)
        return score(text)

    ring.hash_function = counted
    assert ring.get_node(KEYS[0]) == "10.0.0.1:11211"
    assert ring.get_node(KEYS[0]) == "10.0.0.1:11211"
    assert len(hashed) == 1
    ring.KEEP = 10
    for key in KEYS[:25]:  # past KEEP the ring forgets everything at once, and goes on
        assert ring.get_node(key) == "10.0.0.1:11211"
    assert len(hashed) == 1 + 24
    ring.get_node(KEYS[24])  # remembered since the last time it forgot
    assert len(hashed) == 25
    ring.get_node(KEYS[1])  # forgotten
    assert len(hashed) == 26
