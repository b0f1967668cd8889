"""How every API command answers: one JSON document on stdout with `--json`, tables for a
person otherwise, errors on one stderr line with the fix, and the exit codes of docs/cli.md.
Progress goes to stderr, and only when stderr is a terminal (never into a pipe)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, NoReturn

import typer
from rich.console import Console

from modelfleet.api_client import ApiClient, ApiError, RefusedError
from modelfleet.config import ConfigError, resolve

EXIT_OK = 0
EXIT_FAILED = 1  # the command ran, the outcome is a failure (e.g. a version failed to build)
EXIT_USAGE = 2  # bad arguments or local input (typer uses 2 for usage errors too)
EXIT_REFUSED = 3  # the server refused the request (4xx)
EXIT_SERVER = 4  # the server failed (5xx) or could not be reached
EXIT_TIMEOUT = 5  # --wait gave up


@dataclass
class CommandError(Exception):
    """A failure found on this side (bad input, timeout, failed outcome)."""

    message: str
    fix: str | None = None
    exit_code: int = EXIT_USAGE
    payload: dict[str, Any] | None = None  # what --json prints instead of the bare error

    def __str__(self) -> str:
        return self.message


class Out:
    """The answer of one command."""

    def __init__(self, as_json: bool) -> None:
        self.as_json = as_json
        # No markup: names and messages from the server are printed as they are ("[x]" too).
        self.stdout = Console(markup=False, highlight=False)
        self.stderr = Console(stderr=True, markup=False, highlight=False)

    @property
    def live(self) -> bool:
        """Whether progress may be drawn (stderr is a terminal)."""
        return self.stderr.is_terminal

    def result(self, doc: Any, render: Callable[[Console], None]) -> None:
        if self.as_json:
            typer.echo(json.dumps(doc, sort_keys=True))
        else:
            render(self.stdout)

    def note(self, text: str) -> None:
        """A human remark on stderr (never mixed into --json stdout)."""
        if not self.as_json:
            self.stderr.print(text)

    def fail(self, message: str, fix: str | None, exit_code: int,
             doc: dict[str, Any] | None = None, *, answered: bool = False) -> NoReturn:
        """End the command: one stderr line with the fix, and with --json the error document
        on stdout (unless the command already `answered` with its result document)."""
        if self.as_json and not answered:
            typer.echo(json.dumps(doc or {"error": {"detail": message, "fix": fix}},
                                  sort_keys=True))
        line = " ".join(f"error: {message}".split())
        if fix:
            line += " (fix: " + " ".join(fix.split()) + ")"
        typer.echo(line, err=True)
        raise typer.Exit(exit_code)


def exit_code_of(error: ApiError) -> int:
    return EXIT_REFUSED if isinstance(error, RefusedError) else EXIT_SERVER


@contextmanager
def api(server: str | None, token: str | None, as_json: bool) -> Iterator[tuple[ApiClient, Out]]:
    """A client for the resolved server and token, and the command's output; any ApiError,
    ConfigError or CommandError raised inside ends the command with its line and exit code."""
    out = Out(as_json)
    try:
        target = resolve(server, token)
        with ApiClient(target.server, target.token) as client:
            yield client, out
    except ApiError as e:
        out.fail(e.message, e.fix, exit_code_of(e), e.document())
    except ConfigError as e:
        out.fail(str(e), None, EXIT_USAGE)
    except CommandError as e:
        out.fail(e.message, e.fix, e.exit_code, e.payload)
