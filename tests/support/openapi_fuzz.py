"""Shared schemathesis driver for the API fuzz tests of each area.

Every operation carrying one of `tags` in the app's own OpenAPI spec is called with bounded
positive and negative cases; each response is validated against the spec (no 5xx, documented
statuses and bodies) with schemathesis' checks as configured by `config`.

The real token replaces the generated `Authorization` header only where the case carries a
well-formed one that no mutation targeted: a negative case that dropped or malformed the
header must reach the server that way and be rejected (injecting the token everywhere made
such cases valid, and their 200s random "accepted a schema-violating request" failures).
"""

from __future__ import annotations

from typing import Any

import schemathesis

# schemathesis imports its OpenAPI loader lazily, inside `from_asgi`, when the app's threads
# are already running; under pytest that import is an assertion rewrite (ast.parse), which
# CPython 3.11.7 does not keep safe from another thread's ast.parse (a logged traceback
# formats its carets with one) — "SystemError: AST constructor recursion depth mismatch".
# Importing it here, at collection, keeps it out of that window.
import schemathesis.specs.openapi.schemas
from hypothesis import HealthCheck, given, settings
from schemathesis import GenerationMode

# What rejecting a schema-violating request may look like: schemathesis' defaults plus 413,
# the request guard's answer to a body over its cap (a huge generated list, say), which it
# sends before parsing, so before it could tell a 422.
NEGATIVE_REJECTIONS = ["400", "401", "403", "404", "405", "406", "409", "413", "415", "422",
                       "428", "429"]


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
            statuses.append(case.call_and_validate(headers=_auth_for(case, headers)).status_code)

        try:
            check()
        except Exception as e:
            raise AssertionError(f"{operation.label}: {e}") from e
    return fuzzed, statuses


def _auth_for(case: Any, headers: dict[str, str]) -> dict[str, str]:
    """The headers to send with `case`: ours, minus the token when the case's own
    Authorization header is absent, malformed or the subject of a negative mutation."""
    generated = {k.lower(): v for k, v in (case.headers or {}).items()}
    auth = generated.get("authorization")
    keep_generated = (auth is None or not auth.startswith("Bearer ")
                      or _mutates_authorization(case))
    if not keep_generated:
        return headers
    return {k: v for k, v in headers.items() if k.lower() != "authorization"}


def _mutates_authorization(case: Any) -> bool:
    data = getattr(getattr(getattr(case, "meta", None), "phase", None), "data", None)
    for mutation in getattr(data, "mutations", ()) or ():
        names = [getattr(mutation, "parameter", None), *(getattr(mutation, "path", ()) or ())]
        if any(str(n).lower() == "authorization" for n in names if n is not None):
            return True
    parameter = getattr(data, "parameter", None)
    return parameter is not None and str(parameter).lower() == "authorization"
