"""The two ways of parsing a telemetry batch (server/services/fleet/reports.py) give one
answer: the fast way takes an ordinary batch, never a body the strict way refuses or reads
differently, and every refusal (its message and field) is the strict way's."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from manifests.strictjson import MAX_SAFE_INTEGER
from server.errors import InvalidInputError
from server.services.fleet.reports import (
    Batch,
    parse_batch,
    parse_batch_fast,
    parse_batch_strictly,
)
from tests.support.fleet_devices import report_id, shadow_report, update_report

AT = 1_700_000_000


def health_report(**extra: Any) -> dict[str, Any]:
    return {"id": report_id(), "kind": "health", "at": AT, "model": "clf", "version": "1.0",
            "channel": None, "predictions": 9, "errors": 1, "p99_us": 800,
            "rolled_back": False, **extra}


def batch_body(reports: list[dict[str, Any]], **dumps: Any) -> bytes:
    return json.dumps({"device_id": "dev-1", "sent_at": AT, "reports": reports},
                      **({"separators": (",", ":")} | dumps)).encode()


def ordinary() -> bytes:
    return batch_body([shadow_report("clf", "1.0", "failed", at=AT),
                       update_report("clf", "1.0", "activated", at=AT), health_report()])


def outcome(parse: Callable[[bytes], Batch | None], body: bytes) -> Any:
    try:
        batch = parse(body)
    except InvalidInputError as e:
        return ("refused", e.message, e.field, e.fix)
    return ("batch", batch, batch and batch.model_dump(exclude_unset=True))


def test_an_ordinary_batch_takes_the_fast_way_to_the_strict_ways_batch() -> None:
    body = ordinary()
    fast = parse_batch_fast(body)
    assert fast is not None
    assert outcome(parse_batch_fast, body) == outcome(parse_batch_strictly, body)
    pretty = json.dumps(json.loads(body), indent=2).encode()  # whitespace between tokens
    assert parse_batch_fast(pretty) == parse_batch_strictly(pretty) == fast


@pytest.mark.parametrize(("old", "new"), [
    ('"dropped":3', '"dropped":3,"dropped":4'),
    ('"dropped":3', '"dropped":3,"dropped" :3'),
    ('"dropped":3', '"dropped":3,\n"dropped"\t\r:4'),
    ('"verdict":"failed"', '"verdict":"failed","verdict":"passed"'),
    ('"kind":"shadow"', '"kind":"shadow","kind":"shadow"'),
    ('"sent_at":', '"sent_at":1,"sent_at":'),
])
def test_a_key_given_twice_is_refused_as_the_strict_way_refuses_it(old: str, new: str) -> None:
    body = ordinary().decode().replace(old, new, 1).encode()
    assert parse_batch_fast(body) is None  # pydantic alone would take the last value
    with pytest.raises(InvalidInputError, match="duplicate JSON object key") as refused:
        parse_batch(body)
    assert refused.value.field == "body"


@pytest.mark.parametrize("change", [
    lambda t: t.replace('"dropped":3', '"dropped":3.0'),
    lambda t: t.replace('"dropped":3', '"dropped":3e0'),
    lambda t: t.replace('"dropped":3', '"dropped":NaN'),
    lambda t: t.replace('"dropped":3', '"dropped":-Infinity'),
    lambda t: t.replace('"dropped":3', f'"dropped":{MAX_SAFE_INTEGER + 1}'),
    lambda t: t.replace('"dropped":3', '"dropped":' + "9" * 5000),
    lambda t: t.replace('"dropped":3', '"dropped":03'),
    lambda t: t.replace('"errors":1', '"errors":true'),
    lambda t: t.replace('"reason":null', '"reason":"\\ud800"'),
    lambda t: t.replace('"reason":null', '"reason":"a\tb"'),
    lambda t: t.replace('"reason":null', '"reason":{"nested":1}'),
    lambda t: t.replace('"reason":null', '"reason":"' + "x" * 501 + '"'),
    lambda t: t.replace('"dropped":3', '"dropped":3,"pixels":[1,2]'),
    lambda t: t.replace('"kind":"health"', '"kind":"keylogger"'),
    lambda t: t + " x",
    lambda t: "\ufeff" + t,
    lambda t: f"[{t}]",
    lambda t: t[:-2],
])
def test_every_other_refusal_is_the_strict_ways_own(change: Callable[[str], str]) -> None:
    body = change(ordinary().decode()).encode("utf-8", "surrogatepass")
    strict = outcome(parse_batch_strictly, body)
    assert strict[0] == "refused"
    assert parse_batch_fast(body) is None
    assert outcome(parse_batch, body) == strict


@pytest.mark.parametrize("reason", ['x": "y', "a\nb\"c\\d", "h\u00e9 \u2603 \U0001f600", "\\u"])
def test_strings_the_fast_way_leaves_to_the_strict_way_parse_the_same(reason: str) -> None:
    for body in (batch_body([health_report(), update_report("clf", "1.0", "failed") |
                             {"reason": reason}], ensure_ascii=ascii) for ascii in (0, 1)):
        assert outcome(parse_batch, body) == outcome(parse_batch_strictly, body)
        assert outcome(parse_batch, body)[0] == "batch"


def test_the_schema_leaves_floats_big_integers_and_free_json_to_refuse() -> None:
    """The fast way leans on this: every number of the schema is a bounded safe integer and
    no field takes arbitrary JSON, so a float, NaN or unsafe integer cannot validate."""
    schema = Batch.model_json_schema()

    def check(where: str, spec: dict[str, Any]) -> None:
        if "anyOf" in spec:
            for option in spec["anyOf"]:
                check(where, option)
            return
        kind = spec.get("type")
        if kind == "integer":
            assert -MAX_SAFE_INTEGER <= spec["minimum"] <= spec["maximum"] <= MAX_SAFE_INTEGER, (
                where)
        elif where == "Batch.reports":
            assert kind == "array" and set(spec["items"]) == {"discriminator", "oneOf"}
        else:
            assert kind in ("string", "boolean", "null"), (where, spec)

    for name, model in [("Batch", schema), *schema["$defs"].items()]:
        assert model["additionalProperties"] is False, name
        for field, spec in model["properties"].items():
            check(f"{name}.{field}", spec)


# Values that make a report field valid or not, and JSON text of every kind.
_values = st.one_of(
    st.none(), st.booleans(), st.integers(-2**60, 2**60), st.floats(allow_nan=True),
    st.sampled_from(["clf", "1.0", "prod", "shadow", "health", "update", "failed", "pending",
                     "0" * 32, "f" * 64, "a,b", '":', "x\u00e9", "\ud800", "\udfff\ud800"]),
    st.text(max_size=8))
_keys = st.sampled_from(["id", "kind", "at", "model", "version", "channel", "samples",
                         "predictions", "errors", "p99_us", "rolled_back", "event", "reason",
                         "verdict", "extra"])


@st.composite
def _hostile_body(draw: st.DrawFn) -> bytes:
    reports = []
    for _ in range(draw(st.integers(1, 3))):
        report = draw(st.sampled_from([health_report(), update_report("clf", "1.0", "failed"),
                                       shadow_report("clf", "1.0", "passed", at=AT)]))
        pairs = list(report.items())
        for key, value in draw(st.lists(st.tuples(_keys, _values), max_size=2)):
            pairs.insert(draw(st.integers(0, len(pairs))), (key, value))  # maybe twice
        colon = draw(st.sampled_from([":", " : ", ":\n"]))
        ascii = draw(st.booleans())
        reports.append("{" + ",".join(
            json.dumps(k) + colon + json.dumps(v, ensure_ascii=ascii) for k, v in pairs) + "}")
    text = f'{{"device_id":"dev-1","sent_at":{AT},"reports":[{",".join(reports)}]}}'
    return text.encode("utf-8", "surrogatepass")


@settings(max_examples=300, deadline=None)
@given(_hostile_body())
def test_the_fast_way_never_takes_what_the_strict_way_refuses_or_reads_otherwise(
        body: bytes) -> None:
    strict = outcome(parse_batch_strictly, body)
    if parse_batch_fast(body) is not None:
        assert outcome(parse_batch_fast, body) == strict
    assert outcome(parse_batch, body) == strict
