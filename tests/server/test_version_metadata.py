"""The upload `metadata` parser: any JSON gives a normalised result or an InvalidInputError
naming a metadata field — never a crash; semver precedence as semver.org defines it."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from server.errors import InvalidInputError, PayloadTooLargeError
from server.services.version_metadata import (
    DTYPES,
    PLATFORMS,
    is_semver,
    parse_metadata,
    semver_key,
)

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                               max_size=4),
    max_leaves=20,
)
known_keys = st.sampled_from(["version", "platforms", "inputs", "notes", "shape", "shapes",
                              "name", "dtype", "onnx", "coreml"])
near_valid = st.fixed_dictionaries(
    {"version": st.sampled_from(["1.0.0", "1.0", "01.2.3", "2.0.0-rc.1", 3]),
     "platforms": st.one_of(st.lists(st.sampled_from([*PLATFORMS, "tpu"]), max_size=3),
                            st.dictionaries(st.sampled_from([*PLATFORMS, "x"]),
                                            st.dictionaries(known_keys, json_values, max_size=2),
                                            max_size=2),
                            json_values),
     "inputs": st.one_of(st.lists(st.dictionaries(known_keys, json_values, max_size=4),
                                  max_size=3), json_values)},
)


@settings(max_examples=300, deadline=None)
@given(st.one_of(json_values, near_valid))
def test_any_json_parses_or_names_a_metadata_field(value: Any) -> None:
    try:
        meta = parse_metadata(json.dumps(value))
    except InvalidInputError as e:
        assert e.field is not None and e.field.startswith("metadata")
        return
    except PayloadTooLargeError:
        return
    assert is_semver(meta.version) and meta.platforms and meta.inputs and meta.variants
    assert all(set(i["shapes"]) == set(meta.variants) for i in meta.inputs)


shape = st.lists(st.integers(1, 4096), min_size=1, max_size=5)


@settings(max_examples=150, deadline=None)
@given(
    platforms=st.lists(st.sampled_from(PLATFORMS), min_size=1, unique=True),
    variants=st.lists(st.from_regex(r"[a-z0-9][a-z0-9_-]{0,8}", fullmatch=True), min_size=1,
                      max_size=4, unique=True),
    per_variant=st.lists(st.booleans(), min_size=1, max_size=4),
    data=st.data(),
)
def test_valid_metadata_normalises_every_input_to_every_variant(
    platforms: list[str], variants: list[str], per_variant: list[bool], data: st.DataObject
) -> None:
    inputs = []
    for n, varied in enumerate(per_variant):
        spec: dict[str, Any] = {"name": f"in{n}", "dtype": data.draw(st.sampled_from(DTYPES))}
        if varied:
            spec["shapes"] = {v: data.draw(shape) for v in variants}
        else:
            spec["shape"] = data.draw(shape)
        inputs.append(spec)
    meta = parse_metadata(json.dumps({"version": "1.2.3", "platforms": platforms,
                                      "inputs": inputs}))
    expected_variants = variants if any(per_variant) else ["default"]
    assert meta.variants == expected_variants
    for given_spec, got in zip(inputs, meta.inputs, strict=True):
        assert set(got["shapes"]) == set(expected_variants)
        if "shape" in given_spec:
            assert all(s == given_spec["shape"] for s in got["shapes"].values())
    assert list(meta.platforms) == platforms


def test_semver_precedence_matches_the_spec_example() -> None:
    ordered = ["1.0.0-alpha", "1.0.0-alpha.1", "1.0.0-alpha.beta", "1.0.0-beta",
               "1.0.0-beta.2", "1.0.0-beta.11", "1.0.0-rc.1", "1.0.0", "1.0.1", "1.2.0",
               "1.10.0", "2.0.0"]
    shuffled = ordered[:]
    random.Random(7).shuffle(shuffled)
    assert sorted(shuffled, key=semver_key) == ordered


@pytest.mark.parametrize("v", ["1.0", "v1.0.0", "01.0.0", "1.0.0-", "1.0.0+", "1.0.0-01", ""])
def test_not_semver(v: str) -> None:
    assert not is_semver(v)


def test_oversize_metadata_is_refused() -> None:
    with pytest.raises(PayloadTooLargeError):
        parse_metadata(json.dumps({"notes": "x" * 70_000}), max_bytes=64 * 1024)
