"""The command-line reference (``docs/cli.md``), generated from the click commands.

Every command of ``pgqueue``, including those other distributions add through the
``pgqueue.commands`` entry points (``worker``, ``api``, ``bench``), gets a section: its
help, its usage line, a table of its options (flag, environment variable, default,
help) and its epilog, such as the exit statuses. The tables are read from the same
objects click parses arguments with, so they cannot drift from the code; a test checks
that the page in the repository is what this module renders now.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Iterator

import click

from pgqueue.cli import main

BEGIN_MARKER = "<!-- cli:begin -->"
END_MARKER = "<!-- cli:end -->"

# What click (8.3 and later) holds as the default of an option that has none.
_UNSET = getattr(click.core, "UNSET", None)


def _cell(text: str) -> str:
    """``text`` on one line, safe inside a Markdown table cell."""
    return " ".join(text.split()).replace("|", "\\|")


def _commands(
    group: click.Group, ctx: click.Context, path: tuple[str, ...]
) -> Iterator[tuple[tuple[str, ...], click.Command, click.Context]]:
    """Every command under ``group``, depth first, in name order, with its context."""
    for name in group.list_commands(ctx):
        command = group.get_command(ctx, name)
        if command is None or command.hidden:
            continue
        sub_ctx = click.Context(command, info_name=name, parent=ctx)
        yield (*path, name), command, sub_ctx
        if isinstance(command, click.Group):
            yield from _commands(command, sub_ctx, (*path, name))


def _flags(option: click.Option, ctx: click.Context) -> str:
    names = ", ".join(f"`{name}`" for name in (*option.opts, *option.secondary_opts))
    if option.is_flag or option.count:
        return names
    return _cell(f"{names} `{option.make_metavar(ctx)}`")


def _default(option: click.Option, ctx: click.Context) -> str:
    """The default as ``--help`` would show it, or nothing for flags that are off and
    options without one (their help says what leaving them out means)."""
    if option.is_flag and not option.default:
        return ""
    if option.show_default is False:
        return ""
    default = option.get_default(ctx, call=False)
    if callable(default) or default in (None, (), False, _UNSET):
        return ""
    if isinstance(option.show_default, str):
        return _cell(option.show_default)
    if isinstance(default, (list, tuple)):
        return ", ".join(f"`{value}`" for value in default)
    if option.is_flag:
        return "on"
    return f"`{default}`"


def _environment(option: click.Option) -> str:
    if not option.envvar:
        return ""
    names = [option.envvar] if isinstance(option.envvar, str) else list(option.envvar)
    return ", ".join(f"`{name}`" for name in names)


def _help(command: click.Command) -> list[str]:
    """The command's help as Markdown paragraphs. A paragraph that click prints as it
    stands (marked with ``\\b``, such as a table of exit statuses) becomes a block of
    text; the others are folded onto one line, as click folds them to the terminal."""
    paragraphs: list[str] = []
    for paragraph in re.split(r"\n\s*\n", inspect.cleandoc(command.help or "")):
        if paragraph.startswith("\b\n"):
            paragraphs.append("```text\n" + paragraph.removeprefix("\b\n") + "\n```")
        elif paragraph.strip():
            paragraphs.append(_cell(paragraph))
    return paragraphs


def _section(path: tuple[str, ...], command: click.Command, ctx: click.Context) -> list[str]:
    name = " ".join(path)
    lines = [f"### `{name}`", ""]
    for paragraph in _help(command):
        lines += [paragraph, ""]
    pieces = " ".join(command.collect_usage_pieces(ctx))
    lines += [f"Usage: `{name} {pieces}`", ""]
    if isinstance(command, click.Group):
        subcommands = [sub for sub in command.list_commands(ctx)]
        lines += ["Commands: " + ", ".join(f"`{name} {sub}`" for sub in subcommands) + ".", ""]
    options = [
        param
        for param in command.get_params(ctx)
        if isinstance(param, click.Option) and not param.hidden and "--help" not in param.opts
    ]
    if options:
        lines += ["| option | environment | default | |", "| --- | --- | --- | --- |"]
        for option in options:
            lines.append(
                f"| {_flags(option, ctx)} | {_environment(option)} | {_default(option, ctx)} "
                f"| {_cell(option.help or '')} |"
            )
        lines.append("")
    if command.epilog:
        lines += ["```text", command.epilog.replace("\b\n", "").strip("\n"), "```", ""]
    return lines


def _anchor(heading: str) -> str:
    """The anchor GitHub gives a heading (lower case, punctuation dropped, spaces to
    hyphens)."""
    return re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")


def render() -> str:
    """The generated part of ``docs/cli.md``: a table of every command, linked to its
    section, then one section per command."""
    root = click.Context(main, info_name="pgqueue")
    commands = list(_commands(main, root, ("pgqueue",)))
    lines = [
        "<!-- Generated by `pgqueue bench report` (nox -s docs) from the click commands; "
        "do not edit by hand. -->",
        "",
        "| command | |",
        "| --- | --- |",
    ]
    for path, command, _ctx in commands:
        name = " ".join(path)
        summary = _cell(command.get_short_help_str(limit=200))
        lines.append(f"| [`{name}`](#{_anchor(name)}) | {summary} |")
    lines.append("")
    lines += _section(("pgqueue",), main, root)
    for path, command, ctx in commands:
        lines += _section(path, command, ctx)
    return "\n".join(lines).rstrip() + "\n"
