"""docs/cli.md's command lists against the live ``dpss`` command, both ways, options included:
a command or option added, renamed or removed without updating the manual fails here. And the
slim client's ``dpss-remote`` against ``dpss``: the same remote commands, nothing else."""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

import click
import pytest
import typer.main
import typer.testing

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
    "audit accept-restore",
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


#: Every page whose shell examples must run as written.
PAGES = [
    DOC.parents[1] / "README.md",
    DOC.parents[1] / "clients" / "python" / "README.md",
    *sorted(DOC.parent.glob("*.md")),
]
_COMMAND = re.compile(r"(?:^|\bexec -T \w+ )(?:[\w./-]*/)?(dpss-remote|dpss)\s+(.*)$")


def example_command_lines() -> list[tuple[str, str, str]]:
    """``(page, program, arguments)`` of every ``dpss``/``dpss-remote`` line in a fenced block
    of the pages, synopsis lines (``[--option X]``, upper-case placeholders) excepted."""
    found = []
    for page in PAGES:
        text = page.read_text()
        for block in re.findall(r"```[a-z]*\n(.*?)```", text, flags=re.DOTALL):
            for line in block.replace("\\\n", " ").splitlines():
                match = _COMMAND.search(line.strip())
                if match is None:
                    continue
                program, rest = match.groups()
                # Up to a comment, a redirection, a pipe or an aligned description.
                rest = re.split(r"\s+(?:#|>>|>|\|)\s|\s{2,}", f"{rest} ")[0]
                if "[" in rest or re.search(r"(?<![$\w])[A-Z][A-Z_]+\b", rest):
                    continue  # a synopsis (checked by the tests above)
                found.append((page.name, program, rest.strip()))
    return found


def parse_as_the_shell_would(program: str, arguments: str) -> None:
    """Resolve ``arguments`` through the live command tree as click would, without running the
    command; raises click's usage errors (an unknown option, a missing argument)."""
    words = shlex.split(re.sub(r"\"?\$(\([^)]*\)|\{?\w+\}?)\"?", "x", arguments))
    cli = make_app() if program == "dpss-remote" else app
    command: Any = typer.main.get_command(cli)
    context = command.make_context(program, words)
    while hasattr(command, "list_commands"):
        rest = [*context._protected_args, *context.args]
        name, command, rest = command.resolve_command(context, rest)
        context = command.make_context(name, rest, parent=context)


def test_every_example_command_in_the_docs_parses_as_written():
    lines = example_command_lines()
    programs = {program for _, program, _ in lines}
    assert programs == {"dpss", "dpss-remote"}  # the README's slim-client line is among them
    for page, program, arguments in lines:
        try:
            parse_as_the_shell_would(program, arguments)
        except typer.TyperException as error:  # typer's own (vendored) click's usage errors
            message = f"{page}: `{program} {arguments}`: {error}"
            raise AssertionError(message) from None


def test_the_parse_check_refuses_what_the_shell_would():
    """``--url`` after a group name is an unknown option there (only commands take it)."""
    with pytest.raises(typer.TyperException, match="No such option: --url"):
        parse_as_the_shell_would("dpss-remote", "datasets --url http://h list")
    parse_as_the_shell_would("dpss-remote", '--url http://h --api-key "$K" datasets list')


def test_the_manual_states_privatepcas_signature():
    """docs/cli.md's ``PrivatePCA(...)`` line names the constructor's parameters, in order, with
    their defaults (it once lacked ``mu``, ``rho`` and ``prior`` and described ``center="private"``
    as always releasing a mean)."""
    import inspect

    from dpss_client import PrivatePCA

    found = re.search(r"- `PrivatePCA\((.+?)\)`", DOC.read_text(), re.S)
    assert found is not None
    stated = [part.strip() for part in " ".join(found.group(1).split()).split(",")]
    actual = [
        name if p.default is inspect.Parameter.empty else f"{name}={p.default!r}".replace("'", '"')
        for name, p in inspect.signature(PrivatePCA).parameters.items()
        if p.kind is not inspect.Parameter.VAR_KEYWORD
    ]
    assert stated == [*actual, "**params"]


def test_no_command_help_shows_source_markup():
    # --help is read by users, not Sphinx: ``NAME`` or :class: there is source markup leaking
    # (serve's help named its constant ``WORKER_STOP_SECONDS`` instead of the 10 seconds).
    runner = typer.testing.CliRunner()
    checked = 0
    for path in live_commands():
        shown = runner.invoke(app, [*path.split(), "--help"], env={"COLUMNS": "200"})
        assert shown.exit_code == 0, (path, shown.output)
        assert not re.search(r"``|:(class|func|data|meth|attr):", shown.output), (
            path,
            shown.output,
        )
        checked += 1
    assert checked > 25
    from service.cli import WORKER_STOP_SECONDS

    serve = runner.invoke(app, ["serve", "--help"], env={"COLUMNS": "200"}).output
    assert f"up to {WORKER_STOP_SECONDS} seconds" in serve


def test_the_readmes_name_every_command_group_of_dpss_remote():
    """Both READMEs list ``dpss-remote``'s commands in a parenthesis (``datasets``, ...,
    ``audit list``); the list is the remote app's top-level commands (``priors`` was missing
    from both after it was added)."""
    groups = {path.split()[0] for path in live_commands(make_app())}
    groups = {"audit list" if group == "audit" else group for group in groups}
    for page in PAGES[:2]:
        text = " ".join(page.read_text().split())
        listed = re.search(
            r"remote commands of (?:the server's )?`dpss`(?: command)? \(([^)]*)\)", text
        )
        assert listed is not None, page
        assert set(re.findall(r"`([^`]+)`", listed.group(1))) == groups, page
