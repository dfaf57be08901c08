"""A gateway's /metrics read the way Prometheus reads it: prometheus_client's own parser.

A test asks for the samples of one name whose labels include the ones it names (a
histogram's _count, a counter's _total), so a label added later does not break it.
"""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families


def samples(text: str, name: str, /, **labels: str) -> list[float]:
    """The values of the samples named ``name`` whose labels include ``labels``."""
    return [
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items())
    ]
