"""Typer details every `modelfleet` command shares: switches shown without a `<bool>`
placeholder, and a clear message for `--wait true` (a switch takes no value)."""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING, Any

import typer
from typer.core import TyperGroup
from typer.exceptions import TyperException

if TYPE_CHECKING:  # the types TyperGroup's methods declare (typer vendors click)
    from typer._click import Command, Context

ARGV_KEY = "modelfleet.argv"
BOOL_WORDS = frozenset({"true", "false", "yes", "no", "on", "off", "1", "0"})


def switch(*names: str, help: str) -> Any:
    """A boolean option shown as a bare switch in help (`--wait`, not `--wait <bool>`)."""
    return typer.Option(*names, help=help, metavar="")


def bare_switches(command: Command, ctx: Context) -> None:
    """Give every switch of `command` and of its subcommands — `--help` included, which typer
    creates itself — an empty metavar, so help shows `--wait`, not `--wait <bool>`."""
    params = [*command.params, command.get_help_option(ctx)]
    for param in params:
        if param is not None and getattr(param, "is_flag", False) and param.metavar is None:
            param.metavar = ""
    for sub in getattr(command, "commands", {}).values():
        bare_switches(sub, ctx)


class ModelfleetGroup(TyperGroup):
    """The root command group: help without `<bool>` after switches, and a usage error
    caused by a value after a switch (`--wait true`) says so instead of "unexpected extra
    argument" (the command line is remembered for that)."""

    def parse_args(self, ctx: Context, args: list[str]) -> list[str]:
        ctx.meta.setdefault(ARGV_KEY, list(args))
        bare_switches(self, ctx)
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
