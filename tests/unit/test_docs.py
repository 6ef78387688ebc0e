"""The docs site builds strictly, its reference lists everything the code has, every included file
is shown whole, and every `procbus ...` command line in the docs and the README is a real one."""

from __future__ import annotations

import html
import os
import re
import shlex
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import typer

from procbus.config import setting_names
from procbus.core.metrics import PROCBUS_METRICS
from procbus.errors import ErrorType, ProcbusError
from procbus.starter.cli import app
from procbus.starter.scenes import DEMO_STEPS, SCENES, load_scene, scene_number

PROJECT = Path(__file__).resolve().parents[2]
DOCS = PROJECT / "docs"
HEADING = re.compile(r'<h([1-6]) id="([^"]+)"[^>]*>(.*?)</h\1>', re.DOTALL)


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("site")
    built = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(folder)],
        cwd=PROJECT,
        # This checkout's code, whatever the environment installed.
        env={**os.environ, "PYTHONPATH": str(PROJECT), "NO_MKDOCS_2_WARNING": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert built.returncode == 0, built.stdout + built.stderr
    assert "WARNING" not in built.stderr, built.stderr
    return folder


def text_of(page: str) -> str:
    """A built page's text: tags dropped, entities decoded."""
    return html.unescape(re.sub(r"<[^>]+>", "", page))


def sections(page: str) -> dict[str, str]:
    """Each heading's text and the text under it, up to the next heading."""
    found = list(HEADING.finditer(page))
    return {
        text_of(match[3]).replace("¶", "").strip(): text_of(
            page[match.end() : found[i + 1].start() if i + 1 < len(found) else len(page)]
        )
        for i, match in enumerate(found)
    }


def commands() -> Iterator[tuple[tuple[str, ...], Any, Any]]:
    """(path, command, context) of every command and group of the typer app."""
    root = typer.main.get_command(app)
    pending = [(("procbus",), root, root.context_class(root, info_name="procbus"))]
    while pending:
        path, command, context = pending.pop()
        yield path, command, context
        if hasattr(command, "list_commands"):
            for name in command.list_commands(context):
                sub = command.get_command(context, name)
                if not sub.hidden:
                    sub_context = sub.context_class(sub, info_name=name, parent=context)
                    pending.append(((*path, name), sub, sub_context))


def option_names(command: Any, context: Any) -> set[str]:
    return {
        name
        for parameter in command.get_params(context)
        if parameter.param_type_name == "option"
        for name in [*parameter.opts, *parameter.secondary_opts]
    }


def test_the_cli_reference_lists_every_command_and_option(site: Path) -> None:
    reference = sections((site / "reference" / "cli" / "index.html").read_text())
    every = list(commands())
    assert len(every) > 50
    for path, command, context in every:
        heading = " ".join(path)
        assert heading in reference, f"{heading} is missing from the CLI reference"
        for name in option_names(command, context) - {"--help"}:
            assert name in reference[heading], f"{heading} {name} is missing"
        first_line = (command.help or "").strip().splitlines()[0]
        assert " ".join(first_line.split()) in " ".join(reference[heading].split())


def test_the_settings_reference_lists_every_setting(site: Path) -> None:
    page = text_of((site / "reference" / "settings" / "index.html").read_text())
    names = setting_names()
    assert "PROCBUS_FAULTS" in names and len(names) > 30
    assert sorted(name for name in names if name not in page) == []


def test_getting_started_lists_every_demo_scene_and_its_name() -> None:
    """The numbered scenes (the stack check first) with their titles, `--only`'s names, and the
    scenes that bring create-table along: as the registry (starter/scenes/) has them."""
    page = (DOCS / "getting-started.md").read_text()
    section = page[page.index("## The demo") :]
    numbered = re.findall(r"^(\d+)\. \*\*", section, flags=re.MULTILINE)
    assert numbered == [str(n) for n in range(1, len(DEMO_STEPS) + 2)]
    titles = re.findall(r"^\d+\. \*\*(.+?)\*\*", section, flags=re.MULTILINE)
    assert titles == [load_scene(name).title for name in SCENES]
    only = section[section.index("`procbus demo --only") :].split(")", 1)[0]
    assert re.findall(r"`([a-z-]+)`", only) == list(DEMO_STEPS)
    needing = [str(scene_number(name)) for name in DEMO_STEPS if load_scene(name).needs]
    assert f"namespace ({', '.join(needing)}) brings scene 2 along" in " ".join(section.split())
    count = {12: "twelve", 13: "thirteen", 14: "fourteen"}[len(DEMO_STEPS) + 1]
    for said in (PROJECT / "README.md", DOCS / "index.md"):
        assert f"the demo's {count} scenes" in said.read_text(), said


def test_the_metrics_page_lists_every_metric(site: Path) -> None:
    page = text_of((site / "how-to" / "metrics" / "index.html").read_text())
    assert "procbus_procedure_states" in PROCBUS_METRICS
    assert [name for name in PROCBUS_METRICS if name not in page] == []


def test_the_errors_reference_lists_every_error_type_and_class(site: Path) -> None:
    page = text_of((site / "reference" / "errors" / "index.html").read_text())
    assert sorted(kind.value for kind in ErrorType if f"{kind.value}" not in page) == []
    import procbus.errors

    declared = [
        cls
        for cls in vars(procbus.errors).values()
        if isinstance(cls, type) and issubclass(cls, ProcbusError) and cls is not ProcbusError
    ]
    assert (
        sorted(cls.__name__ for cls in declared if f"procbus.errors.{cls.__name__}" not in page)
        == []
    )


# ---- included code ----


def includes() -> Iterator[tuple[Path, str, str | None]]:
    """(page, included file, section) of every `--8<--` line in docs/."""
    for page in sorted(DOCS.rglob("*.md")):
        for match in re.finditer(r'^--8<-- "([^":]+)(?::([a-z_]+))?"$', page.read_text(), re.M):
            yield page, match[1], match[2]


def included_text(path: str, section: str | None) -> str:
    text = (PROJECT / path).read_text()
    if section is not None:
        text = text.split(f"--8<-- [start:{section}]\n", 1)[1].split(f"# --8<-- [end:{section}]")[0]
    lines = [line for line in text.splitlines() if "--8<-- [" not in line]
    return textwrap.dedent("\n".join(lines)).strip()


def test_every_included_file_is_shown_whole(site: Path) -> None:
    found = list(includes())
    assert len(found) >= 15
    for page, path, section in found:
        built = site / page.relative_to(DOCS).with_suffix("") / "index.html"
        if page.name == "index.md":
            built = site / page.relative_to(DOCS).parent / "index.html"
        shown = text_of(built.read_text())
        for line in included_text(path, section).splitlines():
            assert line.strip() in shown, f"{page.name} does not show {path}: {line!r}"


def test_included_examples_are_run_by_the_tests() -> None:
    examples = {path for _page, path, _section in includes() if path.startswith("examples/")}
    tested = "".join(
        test.read_text()
        for folder in ("integration", "cluster")
        for test in (PROJECT / "tests" / folder).glob("test_*.py")
    )
    user_project_test = (PROJECT / "tests" / "e2e" / "test_user_project.py").read_text()
    for path in examples:
        if path.startswith("examples/user-project/"):
            # The user project is built, installed and run whole, as its own application.
            assert '"user-project"' in user_project_test and (PROJECT / path).is_file(), path
            continue
        assert f"from {path.removesuffix('.py').replace('/', '.')} import" in tested, path


# ---- command lines ----


def command_lines() -> Iterator[tuple[str, str]]:
    """(where, line) of every `procbus ...` command in a bash block or a code span."""
    for document in [PROJECT / "README.md", *sorted(DOCS.rglob("*.md"))]:
        text = document.read_text()
        for block in re.findall(r"```bash\n(.*?)```", text, re.DOTALL):
            for line in block.replace("\\\n", " ").splitlines():
                for part in re.split(r"&&|;|\|(?![^'\"]*['\"])", line.split(" #")[0]):
                    words = part.split()
                    while words and re.match(r"^[A-Z_]+=", words[0]):
                        words.pop(0)  # VAR=value before the command
                    if words and (words[0] == "procbus" or words[0].endswith("/procbus")):
                        yield document.name, " ".join(words)
        prose = re.sub(r"```.*?```", "", text, flags=re.DOTALL)
        for span in re.findall(r"`(procbus [^`]+)`", prose):
            yield document.name, span


def check_command_line(line: str, tree: dict[tuple[str, ...], tuple[Any, Any]]) -> str | None:
    try:
        words = shlex.split(line)
    except ValueError:
        words = line.split()
    path: tuple[str, ...] = ("procbus",)
    value_next = False
    for index, word in enumerate(words[1:], start=1):
        if value_next:  # a group option's value: `procbus --namespace staging proc list`
            value_next = False
            continue
        command, context = tree[path]
        if hasattr(command, "list_commands"):
            if word in ("--help", "..."):
                return None
            if word.startswith("-"):
                option = word.split("=")[0]
                given = [p for p in command.get_params(context) if option in p.opts]
                if not given:
                    return f"{' '.join(path)} has no option {option!r}"
                value_next = "=" not in word and not getattr(given[0], "is_flag", False)
                continue
            names = word.split("|")
            if not all((*path, name) in tree for name in names):
                return f"no command {' '.join((*path, word))!r}"
            path = (*path, names[0])
            continue
        known = option_names(command, context) | {"--help"}
        for rest in words[index:]:
            option = rest.strip("[]").split("=")[0]
            if option.startswith("-") and option != "-" and option not in known:
                return f"{' '.join(path)} has no option {option!r}"
        return None
    return None


def test_every_command_line_in_the_docs_is_a_real_command() -> None:
    tree = {path: (command, context) for path, command, context in commands()}
    found = list(command_lines())
    assert len(found) > 100
    wrong = [
        (where, line, problem)
        for where, line in found
        if (problem := check_command_line(line, tree)) is not None
    ]
    assert wrong == []


def test_the_readme_is_short_and_its_links_lead_somewhere() -> None:
    readme = (PROJECT / "README.md").read_text()
    assert len(readme.splitlines()) <= 250
    links = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", readme)
    local = [link for link in links if not link.startswith(("http://", "https://"))]
    assert len(local) > 20
    assert [link for link in local if not (PROJECT / link).exists()] == []
