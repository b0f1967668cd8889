"""The second half (by op) of the ONNX node-case conformance check: see
tests/compile/test_onnx_conformance.py and tests/compile/conformance_halves.py."""

from __future__ import annotations

import pytest

from tests.compile.conformance_halves import check_half


@pytest.mark.slow
def test_every_claimed_op_of_the_second_half_passes_95_percent_of_its_node_cases() -> None:
    check_half(1)
