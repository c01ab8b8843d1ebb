"""The user docs (README.md, docs/*.md) name only commands, routes, targets and files that exist.

- every ``understudy <command> [<action>]`` in a code block or inline code is a command of the
  real argparse parser, and every ``--flag`` after it is one of that command's options;
- every ``/v1/...`` path matches a route of the controller's FastAPI app (``{app_id}`` and
  concrete ids match any segment);
- every ``make <target>`` is a target of the Makefile;
- every repository path in backticks (with a ``/`` and a file extension, or ending in ``/``)
  exists;
- the generated pages (docs/rest-api.md, docs/benchmarks.md) are what their generators write.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import inspect
import json
import re
import subprocess
import sys
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from tests.unit.scripts import load_script

REPO = Path(__file__).resolve().parents[2]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]

FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.S | re.M)
INLINE = re.compile(r"`([^`]+)`")
COMMAND = re.compile(r"(?:^|[\s/(])understudy((?:\s+--log-level\s+\S+)?)\s+([a-z][a-z-]*)"
                     r"(?:\s+([a-z][a-z0-9-]*))?")
FLAG = re.compile(r"(?<![\w-])(--[a-z][a-z0-9-]*)")
REST = re.compile(r"(?<![\w.:/])(/v1/[A-Za-z0-9_{}./-]*)")
MAKE = re.compile(r"(?:^|[\s(])make\s+([a-z][a-z0-9_-]*)")
EXTENSION = re.compile(r"\.[A-Za-z0-9]+$")
GLOBAL_FLAGS = {"--log-level", "--help"}


def _text(path: Path) -> str:
    return path.read_text(encoding="utf-8")


def _code_lines(text: str) -> list[str]:
    """Lines of fenced code (continuations joined) plus the inline spans that are commands."""
    lines: list[str] = []
    for block in FENCE.findall(text):
        lines += block.replace("\\\n", " ").splitlines()
    lines += [span for span in _inline_spans(text)
              if re.match(r"(\S*/)?(understudy|make)\s", span)]
    return lines


def _inline_spans(text: str) -> list[str]:
    return [" ".join(span.split()) for span in INLINE.findall(FENCE.sub("", text))]


# --- the CLI ------------------------------------------------------------------------------------

@cache
def _cli() -> tuple[Any, Any] | None:
    """(build, load): how to build the real ``understudy`` parser without running anything."""
    for name in ("understudy.cli.main", "understudy.cli"):
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError:
            continue
        build = getattr(module, "build_parser", None)
        if build is not None and "command" in inspect.signature(build).parameters:
            # Only the named command registers its options: one parser per command.
            return build, getattr(module, "load_command", lambda _: None)
    return None


@cache
def _command_parser(word: str) -> argparse.ArgumentParser | None:
    """The sub-parser of top-level command ``word`` (None when there is no such command)."""
    cli = _cli()
    assert cli is not None
    build, load = cli
    return _children(build(word, load(word))).get(word)


def _children(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _options(parser: argparse.ArgumentParser) -> set[str]:
    return {o for action in parser._actions for o in action.option_strings}


def _invocations() -> list[tuple[str, list[str], list[str]]]:
    """(doc, command words, flags after them) for every ``understudy`` command in the docs."""
    found = []
    for doc in DOCS:
        for line in _code_lines(_text(doc)):
            for match in COMMAND.finditer(line):
                words = [match.group(2)] + ([match.group(3)] if match.group(3) else [])
                rest = re.split(r"\s(?:\||;|&&|#|>)\s|\s#", line[match.end():])[0]
                found.append((doc.name, words, FLAG.findall(rest)))
    return found


def test_docs_name_understudy_commands() -> None:
    invocations = _invocations()
    assert len(invocations) >= 20, "the docs should show the CLI; did the pattern break?"
    named = {tuple(words[:1]) for _, words, _ in invocations}
    for command in ("controller", "agent", "testbed", "sim", "graph", "models"):
        assert (command,) in named, f"no doc shows 'understudy {command}'"


def test_every_documented_command_and_flag_exists() -> None:
    problems = []
    for doc, words, flags in _invocations():
        if _cli() is None:  # no parser API found: fall back to the installed CLI
            problems += _check_by_subprocess(doc, words)
            continue
        node: argparse.ArgumentParser | None = _command_parser(words[0])
        if node is None:
            problems.append(f"{doc}: 'understudy {words[0]}' is no command")
            continue
        path = [words[0]]
        for word in words[1:]:
            children = _children(node)
            if not children:
                break  # a leaf: the next word is an argument, not a command
            if word not in children:
                problems.append(f"{doc}: 'understudy {' '.join([*path, word])}' is no command")
                node = None
                break
            node = children[word]
            path.append(word)
        if node is None or path == ["demo"]:  # demo parses its own arguments
            continue
        if _children(node):
            problems.append(f"{doc}: 'understudy {' '.join(path)}' needs an action "
                            f"({', '.join(_children(node))})")
            continue
        known = _options(node) | GLOBAL_FLAGS
        problems += [f"{doc}: 'understudy {' '.join(path)}' has no option {flag}"
                     for flag in flags if flag not in known]
    assert not problems, "\n".join(sorted(set(problems)))


def _check_by_subprocess(doc: str, words: list[str]) -> list[str]:
    binary = Path(sys.executable).with_name("understudy")
    for count in (len(words), 1):
        result = subprocess.run([str(binary), *words[:count], "--help"], capture_output=True,
                                timeout=60, check=False)
        if result.returncode == 0:
            return []
    return [f"{doc}: 'understudy {' '.join(words)} --help' fails"]


# --- REST paths ---------------------------------------------------------------------------------

@cache
def _routes() -> tuple[str, ...]:
    app = load_script("bench/api_doc.py").build_app()
    return tuple(route.path for route in app.routes if route.path.startswith("/v1/"))


def _route_pattern(template: str) -> re.Pattern[str]:
    return re.compile("^" + re.sub(r"\\{[^}]*\\}|\{[^}]*\}", "[^/]+", re.escape(template)) + "$")


def _documented_paths() -> list[tuple[str, str]]:
    found = []
    for doc in DOCS:
        for path in REST.findall(_text(doc)):
            found.append((doc.name, path.rstrip("./")))
    return found


def test_every_documented_rest_path_is_a_route() -> None:
    routes = _routes()
    assert "/v1/apps/{app_id}" in routes and "/v1/events/ws" in routes
    paths = _documented_paths()
    assert len(paths) >= 20, "the docs should name the REST API; did the pattern break?"
    patterns = [_route_pattern(r) for r in routes]
    prefixes = {"/".join(r.split("/")[:n]) for r in routes for n in range(3, r.count("/") + 1)}
    problems = []
    for doc, path in paths:
        concrete = re.sub(r"\{[^}]*\}", "x", path)
        if any(p.match(concrete) for p in patterns) or path in prefixes:
            continue
        problems.append(f"{doc}: {path} matches no route")
    assert not problems, "\n".join(sorted(set(problems)))


def test_route_patterns_match_ids_and_nothing_else() -> None:
    pattern = _route_pattern("/v1/servers/{server_id}/drain")
    assert pattern.match("/v1/servers/s2/drain")
    assert not pattern.match("/v1/servers/s2/drain/now")
    assert not pattern.match("/v1/servers/drain")


# --- make targets -------------------------------------------------------------------------------

def _make_targets() -> set[str]:
    targets: set[str] = set()
    for line in _text(REPO / "Makefile").splitlines():
        match = re.match(r"^([A-Za-z0-9_. $()/-][^:=#]*):(?!=)", line)
        if match:
            targets.update(match.group(1).split())
    return targets


def test_every_documented_make_target_exists() -> None:
    targets = _make_targets()
    assert {"demo", "test"} <= targets
    named = [(doc.name, t) for doc in DOCS for line in _code_lines(_text(doc))
             for t in MAKE.findall(line)]
    assert {t for _, t in named} >= {"demo", "test"}
    missing = [f"{doc}: make {target}" for doc, target in named if target not in targets]
    assert not missing, "targets not in the Makefile:\n" + "\n".join(sorted(set(missing)))


# --- repository paths ---------------------------------------------------------------------------

def _is_repo_path(span: str) -> bool:
    if " " in span or "/" not in span or "://" in span:
        return False
    if any(ch in span for ch in "<>{}*$[]|=,") or "..." in span:
        return False
    if span.startswith(("/", "~", ".venv/", "runs/", "sim-results")):
        return False
    first = span.split("/")[0]
    if first.isupper() or first.replace("_", "").isupper():
        return False  # a placeholder such as RUN_DIR/logs
    return span.endswith("/") or bool(EXTENSION.search(span.rsplit("/", 1)[-1]))


def _path_exists(span: str) -> bool:
    if span.startswith("shared/"):
        shared = REPO.parent / "shared"
        return not shared.is_dir() or (REPO.parent / span).exists()
    return (REPO / span).exists()


def test_every_documented_file_path_exists() -> None:
    spans = [(doc.name, s) for doc in DOCS for s in _inline_spans(_text(doc)) if _is_repo_path(s)]
    assert len(spans) >= 20, "the docs should point at the code; did the pattern break?"
    missing = [f"{doc}: {span}" for doc, span in spans if not _path_exists(span)]
    assert not missing, "paths that do not exist:\n" + "\n".join(sorted(set(missing)))


def test_path_filter() -> None:
    assert _is_repo_path("controller/api.py") and _is_repo_path("policies/")
    assert not _is_repo_path("RUN_DIR/logs") and not _is_repo_path("<fig>/summary.csv")
    assert not _is_repo_path("http://127.0.0.1:8000") and not _is_repo_path("/v1/apps")
    assert not _path_exists("controller/no_such_module.py")


# --- generated pages ----------------------------------------------------------------------------

def test_readme_is_a_front_door() -> None:
    readme = _text(REPO / "README.md")
    assert len(readme.splitlines()) <= 150
    for doc in DOCS[1:]:
        assert f"docs/{doc.name}" in readme, f"README does not link docs/{doc.name}"


def test_rest_api_page_is_generated_from_the_app() -> None:
    api_doc = load_script("bench/api_doc.py")
    expected = api_doc.render(api_doc.build_app())
    assert "### POST /v1/apps" in expected
    assert _text(REPO / "docs" / "rest-api.md") == expected, \
        "docs/rest-api.md is stale: run python bench/api_doc.py"


def test_benchmarks_page_is_generated_from_the_results() -> None:
    bench_doc = load_script("bench/benchmarks_doc.py")
    assert _text(REPO / "docs" / "benchmarks.md") == bench_doc.render(), \
        "docs/benchmarks.md is stale: run python bench/benchmarks_doc.py"
    for name in bench_doc.BENCHES:
        assert (REPO / "bench" / f"{name}.py").exists(), f"no script for {name}"


def test_recording_a_bench_result(tmp_path: Path) -> None:
    bench_doc = load_script("bench/benchmarks_doc.py")
    output = tmp_path / "out.txt"
    output.write_text('starting\n{"not": "last"}\n{"dead_ms": 21.5, "busy_cpu_ms": 40}\n\n')
    path = bench_doc.record("kill_cost", output, results=tmp_path / "results")
    document: dict[str, Any] = json.loads(path.read_text())
    assert document["bench"] == "kill_cost" and document["result"]["dead_ms"] == 21.5
    assert document["recorded_at"]
    page = bench_doc.render(tmp_path / "results")
    assert "| all processes gone after the kill (ms) | 21.5 |" in page
    assert page.count("No result recorded yet.") == len(bench_doc.BENCHES) - 1
    with pytest.raises(ValueError):
        bench_doc.record("no_such_bench", output, results=tmp_path / "results")
    output.write_text("no json here\n")
    with pytest.raises(ValueError):
        bench_doc.record("kill_cost", output, results=tmp_path / "results")
