"""docs/cli.md's command lists against the live ``dpss`` command, both ways, options included:
a command or option added, renamed or removed without updating the manual fails here. And the
slim client's ``dpss-remote`` against ``dpss``: the same remote commands, nothing else."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import click
import typer.main

from dpss_client.remote_cli import make_app
from service.cli import app

DOC = Path(__file__).resolve().parents[1] / "docs" / "cli.md"
#: Taken by every remote command and documented once under the list.
COMMON = {"--url", "--api-key", "--json", "--help"}


#: The commands of ``dpss`` that open the database and so are not in ``dpss-remote``.
OPERATOR = {
    "serve",
    "api",
    "worker",
    "migrate",
    "keys create",
    "keys list",
    "keys revoke",
    "audit verify",
    "audit head",
}


def live_commands(cli: typer.Typer = app) -> dict[str, set[str]]:
    """Every leaf command's path (``"releases list"``) and its visible ``--options``."""
    root = typer.main.get_command(cli)
    context = click.Context(root)
    found: dict[str, set[str]] = {}

    def walk(command: Any, path: list[str]) -> None:
        # Typer may vendor its own click: recognise a group by what it does.
        if hasattr(command, "list_commands"):
            for name in command.list_commands(context):
                sub = command.get_command(context, name)
                if sub is not None and not sub.hidden:
                    walk(sub, [*path, name])
            return
        found[" ".join(path)] = {
            option
            for parameter in command.params
            if not getattr(parameter, "hidden", False)
            for option in parameter.opts
            if option.startswith("--")
        }

    walk(root, [])
    return found


def documented_commands() -> dict[str, set[str]]:
    """The ``dpss ...`` lines of docs/cli.md's "Commands" section (continuation lines are
    indented), as command path and the ``--options`` they mention."""
    section = DOC.read_text().split("## Commands", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```\n(.*?)```", section, flags=re.DOTALL)
    live = live_commands()
    groups = {path.split()[0] for path in live if " " in path}
    documented: dict[str, set[str]] = {}
    current = None
    for block in blocks:
        for line in block.splitlines():
            if line.startswith("dpss "):
                words = line.split()[1:]
                depth = 2 if words[0] in groups else 1
                current = " ".join(words[:depth])
                documented.setdefault(current, set())
            elif not line.startswith(" ") or current is None:
                current = None
                continue
            documented[current] |= set(re.findall(r"--[a-z][a-z-]*", line.split("  (")[0]))
    return documented


def test_every_command_in_the_manual_exists_and_every_command_is_in_the_manual():
    assert set(documented_commands()) == set(live_commands())


def test_the_options_in_the_manual_are_the_commands_options():
    live = live_commands()
    for path, options in documented_commands().items():
        assert options <= live[path], (path, options - live[path])
        assert live[path] - COMMON <= options, (path, live[path] - COMMON - options)


def test_the_manual_lists_every_mechanism():
    from service.mechanisms.registry import MECHANISMS

    text = DOC.read_text()
    assert f"{len(MECHANISMS)} mechanism(s)" in text
    for name in MECHANISMS:
        assert name in text, name


def test_dpss_remote_has_the_remote_commands_of_dpss_with_the_same_options():
    server = live_commands()
    remote = live_commands(make_app())
    assert set(server) - set(remote) == OPERATOR
    assert remote == {path: options for path, options in server.items() if path not in OPERATOR}
