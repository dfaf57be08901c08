"""Bounded values of metric labels that more than the metrics module reads (the status page
reshapes the same series). No I/O here."""

# The cache `outcome` label: the X-LLMGate-Cache status (app/cache/policy.py) in lower case,
# a HIT naming its level.
CACHE_OUTCOMES = ("hit_l1", "hit_l2", "miss", "bypass", "refresh", "coalesced")
