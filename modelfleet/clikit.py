"""Typer details every `modelfleet` command shares: switches shown without a `<bool>`
placeholder, and a clear message for `--wait true` (a switch takes no value)."""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING, Any

import typer
from typer.core import TyperGroup
from typer.exceptions import TyperException

if TYPE_CHECKING:  # the context type TyperGroup's methods declare (typer vendors click)
    from typer._click import Context

ARGV_KEY = "modelfleet.argv"
BOOL_WORDS = frozenset({"true", "false", "yes", "no", "on", "off", "1", "0"})


def switch(*names: str, help: str) -> Any:
    """A boolean option shown as a bare switch in help (`--wait`, not `--wait <bool>`)."""
    return typer.Option(*names, help=help, metavar="")


class ModelfleetGroup(TyperGroup):
    """The root command group: remembers the command line so a usage error caused by a value
    after a switch (`--wait true`) can say so instead of "unexpected extra argument"."""

    def parse_args(self, ctx: Context, args: list[str]) -> list[str]:
        ctx.meta.setdefault(ARGV_KEY, list(args))
        return super().parse_args(ctx, args)

    def invoke(self, ctx: Context) -> Any:
        try:
            return super().invoke(ctx)
        except TyperException as e:
            better = switch_given_a_value(e, ctx.meta.get(ARGV_KEY, []))
            if better is None:
                raise
            raise better from None


def switch_given_a_value(error: Exception, argv: list[str]) -> typer.BadParameter | None:
    """The clearer error for `--switch VALUE`, when that is what `error` is about."""
    message = str(getattr(error, "message", ""))
    failed: Context | None = getattr(error, "ctx", None)
    if failed is None or not message.startswith("Got unexpected extra argument"):
        return None
    switches = {name: param for param in failed.command.params
                if getattr(param, "is_flag", False)
                for name in (*param.opts, *param.secondary_opts)}
    for name, value in itertools.pairwise(argv):
        if name in switches and value.lower() in BOOL_WORDS:
            return typer.BadParameter(
                f"{name} is a switch and takes no value: write `{name}` alone to turn it on "
                f"(leave it out for off), not `{name} {value}`", ctx=failed)
    return None
