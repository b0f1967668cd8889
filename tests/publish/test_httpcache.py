"""Conditional and range request rules of the serving routes."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from server.publish.httpcache import (
    ByteRange,
    RangeNotSatisfiable,
    etag_for,
    if_none_match,
    parse_range,
)

TAG = etag_for("ab" * 32)


@pytest.mark.parametrize(("header", "match"), [
    (None, False), ("", False), (TAG, True), (f'"x", {TAG}', True), (f"W/{TAG}", True),
    ("*", True), ('"other"', False), (TAG[:-2] + '"', False),
])
def test_if_none_match_uses_weak_comparison_over_a_list(header, match):
    assert if_none_match(header, TAG) is match


@pytest.mark.parametrize(("header", "expected"), [
    ("bytes=0-9", ByteRange(0, 10)), ("bytes=5-", ByteRange(5, 100)),
    ("bytes=-10", ByteRange(90, 100)), ("bytes=-500", ByteRange(0, 100)),
    ("bytes=90-200", ByteRange(90, 100)), ("bytes=0-0", ByteRange(0, 1)),
])
def test_single_ranges_resolve_against_the_length(header, expected):
    assert parse_range(header, 100) == expected


@pytest.mark.parametrize("header", [None, "", "items=0-1", "bytes=0-1,5-6", "bytes=9-3",
                                    "bytes=x-1", "bytes=-", "bytes 0-1"])
def test_unusable_range_headers_mean_the_whole_file(header):
    assert parse_range(header, 100) is None


@pytest.mark.parametrize("header", ["bytes=100-", "bytes=100-200", "bytes=-0"])
def test_ranges_outside_the_file_are_not_satisfiable(header):
    with pytest.raises(RangeNotSatisfiable):
        parse_range(header, 100)


@given(st.integers(0, 10_000), st.integers(0, 10_000), st.integers(1, 10_000))
def test_any_satisfiable_range_stays_inside_the_file(a, b, length):
    try:
        r = parse_range(f"bytes={a}-{b}", length)
    except RangeNotSatisfiable:
        assert a >= length
        return
    if r is not None:
        assert 0 <= r.start < r.end <= length
        assert r.content_range(length).startswith(f"bytes {a}-")
