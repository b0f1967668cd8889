"""README "Production" stays true: its settings table lists exactly the settings
server/settings.py reads, each with its real default."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from server.settings import Settings

README = Path(__file__).resolve().parent.parent / "README.md"
ROW = re.compile(r"^\| `(MODELFLEET_[A-Z0-9_]+)` \| (.+?) \| (.+?) \|$")


def shown(default: Any) -> str:
    """How the table writes a default."""
    if default is None:
        return "(none)"
    if default == "":
        return "(empty)"
    if isinstance(default, bool):
        return f"`{str(default).lower()}`"
    return f"`{default}`"


def table() -> dict[str, tuple[str, str]]:
    text = README.read_text()
    section = text[text.index("### Settings"):text.index("### Key custody")]
    rows = {}
    for line in section.splitlines():
        m = ROW.match(line)
        if m:
            assert m.group(1) not in rows, f"{m.group(1)} listed twice"
            rows[m.group(1)] = (m.group(2), m.group(3))
    return rows


def test_the_settings_table_lists_every_setting_with_its_default() -> None:
    expected = {f"MODELFLEET_{name.upper()}": shown(field.default)
                for name, field in Settings.model_fields.items()}
    rows = table()
    assert sorted(rows) == sorted(expected), (
        "README settings table out of date; rows to have:\n" + "\n".join(
            f"| `{k}` | {v} | … |" for k, v in expected.items()))
    wrong = {k: (rows[k][0], v) for k, v in expected.items() if rows[k][0] != v}
    assert wrong == {}, wrong
    assert all(len(meaning) > 5 for _, meaning in rows.values())


def test_key_custody_names_commands_that_exist() -> None:
    from typer.testing import CliRunner

    from modelfleet.cli import app

    text = README.read_text()
    custody = text[text.index("### Key custody"):text.index("### Metrics, logs and health")]
    for sub in ("init", "rotate", "show"):
        assert f"modelfleet keys {sub}" in custody
        help_text = CliRunner().invoke(app, ["keys", sub, "--help"]).output
        assert "--data-dir" in help_text
    rotate = CliRunner().invoke(app, ["keys", "rotate", "--help"]).output
    for option in ("--root-keys-dir", "--rotate-release"):
        assert option in custody and option in rotate
