"""`modelfleet publish --input` flags → metadata `inputs` entries, scalars included."""

from __future__ import annotations

import pytest

from modelfleet.commands.publish import parse_input
from modelfleet.output import CommandError


@pytest.mark.parametrize("flag", ["sr:int64:scalar", "sr:int64:[]"])
def test_a_scalar_input_flag_declares_an_empty_shape(flag: str) -> None:
    assert parse_input(flag) == {"name": "sr", "dtype": "int64", "shape": []}


def test_a_shape_still_needs_integers() -> None:
    assert parse_input("x:float32:1x3x8x8")["shape"] == [1, 3, 8, 8]
    with pytest.raises(CommandError, match="not a static shape"):
        parse_input("x:float32:1x<batch>")
