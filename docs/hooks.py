"""MkDocs hooks: the reference pages, written from the code at every build so they cannot drift.

- reference/cli.md: every `procbus` command, from the typer app (click's command tree);
- reference/settings.md: every setting, from `procbus.config.Settings`;
- reference/errors.md: every error type, from the registry `procbus.errors.ErrorType`, with the
  exception classes that carry each one.

The pages exist only in the build (never in docs/); tests/unit/test_docs.py builds the site with
`mkdocs build --strict` and checks that each page lists everything introspection finds.
"""

from __future__ import annotations

import html
import importlib
import pkgutil
import re
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mkdocs.config.defaults import MkDocsConfig
    from mkdocs.structure.files import Files

PROJECT = Path(__file__).resolve().parents[1]

# The packages whose exceptions the error reference lists, and whose sources it searches.
CODE_PACKAGES = ("procbus", "activities", "workflows", "worker", "starter")


def use_this_checkout() -> None:
    """Import procbus from this checkout, not from whatever copy the environment installed (an
    editable install's path hook sits early in sys.path; MkDocs restores sys.path after loading
    this file, so it is set here, before the first import)."""
    if sys.path[:1] != [str(PROJECT)]:
        sys.path.insert(0, str(PROJECT))
    import procbus

    if not Path(procbus.__file__ or "").resolve().is_relative_to(PROJECT):
        raise RuntimeError(f"procbus was imported from {procbus.__file__}, not from {PROJECT}")


# ---- markdown helpers ----


def escape_text(text: str, *, in_table: bool = False) -> str:
    """Markdown that shows `text` as written: HTML escaped outside `code spans` (and, in a table
    cell, its pipes; Python-Markdown leaves pipes inside code spans alone)."""

    def plain(part: str) -> str:
        escaped = html.escape(part, quote=False)
        return escaped.replace("|", "\\|") if in_table else escaped

    parts = text.split("`")
    return "`".join(part if index % 2 else plain(part) for index, part in enumerate(parts))


def table_cell(text: str) -> str:
    return escape_text(" ".join(text.split()), in_table=True)


def code_cell(text: str) -> str:
    return f"`{text}`"


# ---- the CLI ----


def walk_commands(command: Any, path: tuple[str, ...], parent: Any = None) -> Iterator[Any]:
    """(path, command, context) for every command and group under `command`, depth first, in
    the order typer registered them. Duck-typed: typer carries its own copy of click."""
    context = command.context_class(command, info_name=path[-1], parent=parent)
    yield path, command, context
    if hasattr(command, "list_commands"):
        for name in command.list_commands(context):
            sub = command.get_command(context, name)
            if sub is not None and not sub.hidden:
                yield from walk_commands(sub, (*path, name), context)


def procbus_command() -> Any:
    import typer

    from procbus.starter.cli import app

    return typer.main.get_command(app)


def parameters_of(command: Any, context: Any) -> list[Any]:
    return [p for p in command.get_params(context) if p.name != "help" and not p.hidden]


def usage(path: tuple[str, ...], command: Any, context: Any) -> str:
    pieces = list(path)
    parameters = parameters_of(command, context)
    if any(p.param_type_name == "option" for p in parameters):
        pieces.append("[OPTIONS]")
    for argument in (p for p in parameters if p.param_type_name == "argument"):
        name = (argument.name or "").upper()
        pieces.append(name if argument.required else f"[{name}]")
    if hasattr(command, "list_commands"):
        pieces.append("COMMAND [ARGS]...")
    return " ".join(pieces)


def describe_parameter(parameter: Any) -> tuple[str, str, str, str]:
    """Name, type, default and help of one parameter, as table cells."""
    kind = parameter.bare_type()
    if parameter.param_type_name == "option":
        names = ", ".join([*parameter.opts, *parameter.secondary_opts])
        kind = "flag" if kind == "bool" else kind
    else:
        names = (parameter.name or "").upper()
    default = parameter.default
    if parameter.required:
        shown_default = "required"
    elif default is None or default is False or default == () or default == []:
        shown_default = ""
    else:
        shown_default = code_cell(str(default))
    return code_cell(names), table_cell(kind), shown_default, table_cell(parameter.help or "")


def cli_reference() -> str:
    lines = [
        "# Command line",
        "",
        "Every `procbus` command, written from the command's own definition at each build of "
        "these docs. The conventions every command follows (exit codes, `--json`, `--wait`) "
        "are in [Getting started](../getting-started.md#using-the-cli).",
        "",
    ]
    for path, command, context in walk_commands(procbus_command(), ("procbus",)):
        depth = len(path)
        heading = "#" * min(depth + 1, 4)
        lines += [f"{heading} {' '.join(path)}", ""]
        if command.help:
            lines += [escape_text(command.help.strip()), ""]
        lines += ["```text", usage(path, command, context), "```", ""]
        parameters = parameters_of(command, context)
        if parameters:
            lines += ["| parameter | type | default | meaning |", "|---|---|---|---|"]
            lines += ["| " + " | ".join(describe_parameter(p)) + " |" for p in parameters]
            lines.append("")
    return "\n".join(lines)


# ---- the settings ----


def type_name(annotation: Any) -> str:
    if isinstance(annotation, type):
        return annotation.__name__
    return re.sub(r"\b(?:typing|pathlib|pydantic\.types)\.", "", str(annotation))


def constraints(metadata: list[Any]) -> str:
    symbols = {"ge": ">=", "gt": ">", "le": "<=", "lt": "<"}
    found = []
    for rule in metadata:
        for attribute, symbol in symbols.items():
            value = getattr(rule, attribute, None)
            if value is not None:
                found.append(f"{symbol} {value}")
    return ", ".join(found)


def settings_reference() -> str:
    from pydantic_core import PydanticUndefined

    from procbus.config import ENV_PREFIX, Settings

    lines = [
        "# Settings",
        "",
        "Every setting is an environment variable (or a line in `.env`), read by the CLI and "
        "the worker at start. Written from `procbus.config.Settings` at each build of these "
        "docs. Unset Temporal or database settings mean the embedded stack of `procbus dev`; "
        "[Running against real services](../how-to/real-services.md) shows them together.",
        "",
        "| setting | type | default | meaning |",
        "|---|---|---|---|",
    ]
    for name, field in Settings.model_fields.items():
        default = field.default
        if default is PydanticUndefined:
            shown_default = "required"
        elif default is None:
            shown_default = "unset"
        else:
            shown_default = code_cell(str(default))
        limits = constraints(field.metadata)
        kind = type_name(field.annotation) + (f" ({limits})" if limits else "")
        meaning = field.description or ""
        if "SecretStr" in kind:
            meaning += " (a secret: never printed)"
        lines.append(
            f"| {code_cell(ENV_PREFIX + name.upper())} | {table_cell(kind)} | {shown_default} "
            f"| {table_cell(meaning)} |"
        )
    return "\n".join(lines) + "\n"


# ---- the errors ----


def error_comments() -> dict[str, str]:
    """Each ErrorType member's one-line comment in procbus/errors.py: what the type means."""
    source = (PROJECT / "procbus" / "errors.py").read_text()
    block = source.split("class ErrorType(StrEnum):", 1)[1]
    member = re.compile(r'^\s+([A-Z_]+) = "([A-Za-z]+)"\s*#\s*(.+)$', re.MULTILINE)
    return {value: comment.strip() for _name, value, comment in member.findall(block)}


def error_classes() -> list[type[Exception]]:
    """Every ProcbusError subclass in procbus's code, imported module by module."""
    from procbus.errors import ProcbusError

    for package_name in CODE_PACKAGES:
        package = importlib.import_module(package_name)
        for module in pkgutil.walk_packages(package.__path__, f"{package_name}."):
            importlib.import_module(module.name)
    found: list[type[Exception]] = []
    pending: list[type[Exception]] = [ProcbusError]
    while pending:
        cls = pending.pop()
        found.append(cls)
        pending.extend(cls.__subclasses__())
    return sorted(found, key=lambda cls: (cls.__module__, cls.__name__))


def modules_naming(member_name: str) -> list[str]:
    """The source files that name `ErrorType.<member_name>`: where the type is raised or read."""
    pattern = re.compile(rf"\bErrorType\.{member_name}\b")
    return sorted(
        str(path.relative_to(PROJECT))
        for package in CODE_PACKAGES
        for path in (PROJECT / package).rglob("*.py")
        if path.name != "errors.py" and pattern.search(path.read_text())
    )


def first_line(doc: str | None) -> str:
    return " ".join((doc or "").strip().split("\n\n")[0].split())


def errors_reference() -> str:
    from procbus.errors import NON_RETRYABLE_ERROR_TYPES, ErrorType, ProcbusError

    comments = error_comments()
    classes = error_classes()
    lines = [
        "# Errors",
        "",
        "Every error type procbus gives a Temporal failure (the `type` of an "
        "`ApplicationError`), from the one registry `procbus.errors.ErrorType`, written at each "
        "build of these docs. Activities raise the exception classes listed; the worker's error "
        "interceptor turns them into `ApplicationError`s of their type, and a step's retry policy "
        "never retries the non-retryable ones (`NON_RETRYABLE_ERROR_TYPES`). A type without a "
        "class is raised as an `ApplicationError` directly, in the files named.",
        "",
        "| type | means | retried | exception classes | named in |",
        "|---|---|---|---|---|",
    ]
    for member in ErrorType:
        carriers = [f"`{cls.__name__}`" for cls in classes if error_type_of(cls) is member]
        retried = "no" if str(member) in NON_RETRYABLE_ERROR_TYPES else "yes"
        lines.append(
            f"| `{member.value}` | {table_cell(comments.get(member.value, ''))} | {retried} "
            f"| {', '.join(carriers) or 'none'} "
            f"| {', '.join(code_cell(m) for m in modules_naming(member.name))} |"
        )
    lines += [
        "",
        "## Exception classes",
        "",
        "Every `ProcbusError` in procbus's code. Those without a type reach the person running "
        "procbus, not a workflow: the CLI prints the message in one line and exits 2 for a bad "
        "setting (`ConfigError`), 1 for the others.",
        "",
        "| class | type | means |",
        "|---|---|---|",
    ]
    for cls in classes:
        if cls is ProcbusError:
            continue
        kind = error_type_of(cls)
        lines.append(
            f"| `{cls.__module__}.{cls.__name__}` | {f'`{kind.value}`' if kind else 'none'} "
            f"| {table_cell(first_line(cls.__doc__))} |"
        )
    return "\n".join(lines) + "\n"


def error_type_of(cls: type[Exception]) -> Any:
    return getattr(cls, "error_type", None)


REFERENCE_PAGES: dict[str, Callable[[], str]] = {
    "reference/cli.md": cli_reference,
    "reference/settings.md": settings_reference,
    "reference/errors.md": errors_reference,
}


def on_files(files: Files, config: MkDocsConfig) -> Files:
    from mkdocs.structure.files import File

    use_this_checkout()
    for path, render in REFERENCE_PAGES.items():
        files.append(File.generated(config, path, content=render()))
    return files
