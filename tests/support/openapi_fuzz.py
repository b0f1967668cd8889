"""Shared schemathesis driver for the API fuzz tests of each area.

Every operation carrying one of `tags` in the app's own OpenAPI spec is called with bounded
positive and negative cases; each response is validated against the spec (no 5xx, documented
statuses and bodies) with schemathesis' checks as configured by `config`.
"""

from __future__ import annotations

from typing import Any

import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis import GenerationMode


def fuzz_operations(app: Any, headers: dict[str, str], tags: set[str], *,
                    examples: int, config: schemathesis.Config) -> tuple[int, list[int]]:
    """Fuzzes the tagged operations; returns (operations fuzzed, every response status)."""
    schema = schemathesis.openapi.from_asgi("/openapi.json", app, config=config)
    fuzzed = 0
    statuses: list[int] = []
    for result in schema.get_all_operations():
        operation = result.ok()
        if not tags & set(operation.tags or []):
            continue
        fuzzed += 1

        @given(case=operation.as_strategy(GenerationMode.POSITIVE)
               | operation.as_strategy(GenerationMode.NEGATIVE))
        @settings(max_examples=examples, deadline=None, database=None,
                  suppress_health_check=list(HealthCheck))
        def check(case: Any) -> None:
            statuses.append(case.call_and_validate(headers=headers).status_code)

        try:
            check()
        except Exception as e:
            raise AssertionError(f"{operation.label}: {e}") from e
    return fuzzed, statuses
