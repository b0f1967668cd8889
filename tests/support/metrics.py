"""Reading Prometheus text exposition in tests: one sample's value by name and labels."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families


def sample(text: str, name: str, **labels: str) -> float:
    """The value of sample `name` whose labels include `labels`; 0.0 when absent (a counter
    child not incremented yet is not exposed)."""
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return float(s.value)
    return 0.0
