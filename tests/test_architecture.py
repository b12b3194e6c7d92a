"""The architecture docs/architecture.md describes holds, and the docs cannot name what is not there.

- Every repository path a Markdown page names in inline code (`hfbert/modeling/model.py`, `tests/test_docs.py`,
  a bare `outputs.py` listed after a path in its folder) and every `python -m` module it names exists.
- The floors: converters/ and hfbert/platform/ (the ground floor) < hfbert/modeling/ < hfbert/inference/ <
  hfbert/tools/ < hfbert/cli.py, hfbert/serve/ < benchmarks/. A module imports only from its own floor or those below
  it, imports inside functions included; no modules import each other in a cycle.
- No family member's module imports another member's (the modules named by the family table's rows).
"""

from __future__ import annotations

import ast
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# Paths in the docs that belong to another repository, and whose.
FOREIGN_PATHS = {"tests/models/bert/test_modeling_bert.py": "transformers' BERT tests"}

# Each room's floor, the ground floor 0. The package root `hfbert` (its public API exports optimize_for_inference,
# and the retrieval tools CrossEncoder and SparseEncoder, imported when first used) stands on the tools floor;
# `python -m hfbert` on the command line's. The benchmarks may import the package,
# never the reverse.
FLOORS = {
    "converters": 0,
    "hfbert.platform": 0,
    "hfbert.modeling": 1,
    "hfbert.inference": 2,
    "hfbert.tools": 3,
    "hfbert.cli": 4,
    "hfbert.serve": 4,
    "hfbert.ray_data": 4,
    "benchmarks": 5,
}
ROOM_OF_MODULE = {"hfbert": "hfbert.tools", "hfbert.__main__": "hfbert.cli"}
PACKAGES = ("converters", "hfbert", "benchmarks")


# -- names in the docs ---------------------------------------------------------------------------------------------
def markdown_pages() -> list[Path]:
    listed = subprocess.run(["git", "ls-files", "*.md"], cwd=ROOT, capture_output=True, text=True, check=False)
    if listed.returncode == 0 and listed.stdout.strip():
        return [ROOT / line for line in listed.stdout.split()]
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]  # not a git checkout


def top_folders() -> set[str]:
    return {entry.name for entry in ROOT.iterdir() if entry.is_dir() and entry.name not in {".git", ".venv"}}


# Inline code spans separated only by commas: `a/b.py`, `c.py` lists c.py in a/.
CODE_RUN = re.compile(r"`[^`\n]+`(?:,\s*`[^`\n]+`)*")


def named_paths(text: str, folders: set[str]) -> list[str]:
    """Repository paths and `python -m` modules named in `text`'s inline code, as paths relative to the root."""
    found = []
    for run in CODE_RUN.finditer(text):
        folder = None
        for span in re.findall(r"`([^`\n]+)`", run.group(0)):
            module = re.search(r"python -m ([\w.]+)", span)
            if module and module.group(1).split(".")[0] in folders:
                name = module.group(1).replace(".", "/")
                found.append(f"{name}/__main__.py" if (ROOT / name).is_dir() else f"{name}.py")
            for word in span.split():
                if word.split("/")[0] in folders and "/" in word:
                    found.append(word)
                    folder = word.rstrip("/").rpartition("/")[0] if not word.endswith("/") else word.rstrip("/")
                elif folder and re.fullmatch(r"[\w-]+\.\w+", word) and span == word:
                    found.append(f"{folder}/{word}")
    return found


def test_named_paths_are_read_as_meant():
    folders = {"hfbert", "tests"}
    text = "`hfbert/modeling/inputs.py`, `outputs.py` and `config.json`; `python -m hfbert.cli` `tests/data/`"
    assert named_paths(text, folders) == [
        "hfbert/modeling/inputs.py",
        "hfbert/modeling/outputs.py",
        "hfbert/cli.py",
        "tests/data/",
    ]


@pytest.mark.parametrize("page", markdown_pages(), ids=lambda page: str(page.relative_to(ROOT)))
def test_every_repository_path_a_page_names_exists(page):
    folders = top_folders()
    missing = [
        path
        for path in named_paths(page.read_text(), folders)
        if path not in FOREIGN_PATHS and not any(ROOT.glob(path.rstrip("/")))
    ]
    assert not missing, f"{page.relative_to(ROOT)} names paths that do not exist: {missing}"


# -- the floors ----------------------------------------------------------------------------------------------------
def module_files(root: Path) -> dict[str, Path]:
    files = {}
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            files[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return files


def imports(module: str, path: Path, known: dict[str, Path]) -> list[tuple[str, int]]:
    """(imported module of this repository, line) for every import statement, top level or nested anywhere."""
    base = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            source = node.module or ""
            if node.level:
                source = ".".join([*base[: len(base) - node.level + 1], *([node.module] if node.module else [])])
            names = [f"{source}.{alias.name}" for alias in node.names]
            names = [name if name in known else source for name in names]  # a submodule, else a name in `source`
        else:
            continue
        for name in names:
            while name not in known and "." in name:
                name = name.rpartition(".")[0]
            if name in known and name != module:
                found.append((name, node.lineno))
    return found


def room(module: str) -> str:
    """The room (a key of FLOORS) a module stands in: the longest that holds it."""
    inside = [prefix for prefix in FLOORS if module == prefix or module.startswith(prefix + ".")]
    named = ROOM_OF_MODULE.get(module) or max(inside, key=len, default=None)
    if named is None:
        raise AssertionError(f"{module} stands on no floor: put it in one of {list(FLOORS)}")
    return named


def floor(module: str) -> int:
    return FLOORS[room(module)]


def upward_imports(root: Path) -> list[str]:
    known = module_files(root)
    return [
        f"{path.relative_to(root)}:{line} imports {target} ({room(target)} is above {room(module)})"
        for module, path in known.items()
        for target, line in imports(module, path, known)
        if floor(target) > floor(module)
    ]


def import_cycles(root: Path) -> list[list[str]]:
    """Every strongly connected group of more than one module (Tarjan), each sorted."""
    known = module_files(root)
    graph = {module: sorted({target for target, _ in imports(module, path, known)}) for module, path in known.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        for target in graph[module]:
            if target not in index:
                visit(target)
                low[module] = min(low[module], low[target])
            elif target in stack:
                low[module] = min(low[module], index[target])
        if low[module] == index[module]:
            group = []
            while True:
                member = stack.pop()
                group.append(member)
                if member == module:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for module in graph:
        if module not in index:
            visit(module)
    return groups


def test_every_module_imports_only_its_floor_and_those_below():
    assert not upward_imports(ROOT), "\n".join(upward_imports(ROOT))


def test_no_import_cycles():
    assert not import_cycles(ROOT)


# -- members import no member ---------------------------------------------------------------------------------------
def member_modules() -> dict[str, str]:
    """module -> the member (model_type) whose row's classes live in it, from the family table. BERT's modules
    (model.py, heads.py, config.py) are left out: they are the base the BERT-shaped members build on by design."""
    from hfbert.modeling.family import MEMBERS, member

    def modules(row) -> set[str]:
        return {cls.__module__ for cls in [row.config_class, *row.classes.values()]}

    bert = modules(member("bert"))
    return {module: row.model_type for row in MEMBERS for module in sorted(modules(row) - bert)}


def member_imports(root: Path, owners: dict[str, str]) -> list[str]:
    """Every import of one member's module by another member's (`owners`: module -> member); what two members share
    lives in a module of no member (shared_heads.py, task.py, encoder.py)."""
    known = module_files(root)
    return [
        f"{path.relative_to(root)}:{line} imports {target} ({owners[target]}'s module into {owners[module]}'s)"
        for module, path in known.items()
        if module in owners
        for target, line in imports(module, path, known)
        if target in owners and owners[target] != owners[module]
    ]


def test_no_member_imports_another_members_module():
    owners = member_modules()
    assert {"hfbert.modeling.roberta", "hfbert.modeling.mpnet", "hfbert.modeling.modernbert"} <= set(owners)
    assert not member_imports(ROOT, owners), "\n".join(member_imports(ROOT, owners))


def test_a_member_importing_another_fails(tmp_path):
    write(
        tmp_path,
        {
            "hfbert/__init__.py": "",
            "hfbert/modeling/__init__.py": "",
            "hfbert/modeling/roberta.py": "from hfbert.modeling.shared_heads import LMHead\n",
            "hfbert/modeling/mpnet.py": "def f():\n    from hfbert.modeling.roberta import RobertaForMaskedLM\n",
            "hfbert/modeling/shared_heads.py": "",
        },
    )
    owners = {"hfbert.modeling.roberta": "roberta", "hfbert.modeling.mpnet": "mpnet"}
    assert member_imports(tmp_path, owners) == [
        "hfbert/modeling/mpnet.py:2 imports hfbert.modeling.roberta (roberta's module into mpnet's)"
    ]


def write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)


def test_an_import_inside_a_function_or_relative_counts(tmp_path):
    """The checks catch what they are for: an upward import hidden in a function, a relative one, a cycle."""
    write(
        tmp_path,
        {
            "converters/__init__.py": "",
            "converters/reading.py": "def load():\n    from hfbert.modeling.config import BertConfig\n",
            "hfbert/__init__.py": "",
            "hfbert/modeling/__init__.py": "",
            "hfbert/modeling/config.py": "from . import model\n",
            "hfbert/modeling/model.py": "from .config import BertConfig\nfrom ..tools import embed\n",
            "hfbert/tools/__init__.py": "",
            "hfbert/tools/embed.py": "import benchmarks.peers\n",
            "hfbert/platform/__init__.py": "",
            "hfbert/platform/cpu.py": "import converters.reading\nfrom hfbert.modeling import config\n",
            "benchmarks/__init__.py": "",
            "benchmarks/peers.py": "",
        },
    )
    assert upward_imports(tmp_path) == [
        "converters/reading.py:2 imports hfbert.modeling.config (hfbert.modeling is above converters)",
        "hfbert/modeling/model.py:2 imports hfbert.tools.embed (hfbert.tools is above hfbert.modeling)",
        "hfbert/platform/cpu.py:2 imports hfbert.modeling.config (hfbert.modeling is above hfbert.platform)",
        "hfbert/tools/embed.py:1 imports benchmarks.peers (benchmarks is above hfbert.tools)",
    ]
    assert import_cycles(tmp_path) == [["hfbert.modeling.config", "hfbert.modeling.model"]]


# -- the package docstrings ----------------------------------------------------------------------------------------
# The floors' packages list their rooms in their docstring ("- `config.py`: ..."): every file must be there, and
# nothing that is not. Other packages' docstrings may name files; those must exist.
FLOOR_PACKAGES = (
    "converters",
    "hfbert/platform",
    "hfbert/modeling",
    "hfbert/inference",
    "hfbert/tools",
    "hfbert/serve",
    "hfbert/ray_data",
)


def listed_rooms(package: Path) -> set[str]:
    """The files and folders a package's docstring names in inline code (`config.py`, `parity/`, converters'
    bare `key_map`), as names in the package."""
    docstring = ast.get_docstring(ast.parse((package / "__init__.py").read_text())) or ""
    names = set()
    for span in re.findall(r"`([^`\n]+)`", docstring):
        if re.fullmatch(r"\w+\.py", span) or (re.fullmatch(r"\w+/", span) and span[:-1] not in top_folders()):
            names.add(span)
        elif re.fullmatch(r"\w+", span) and (package / f"{span}.py").is_file():
            names.add(f"{span}.py")
    return names


def rooms(package: Path) -> set[str]:
    files = {path.name for path in package.glob("*.py") if path.name != "__init__.py"}
    return files | {f"{path.name}/" for path in package.iterdir() if (path / "__init__.py").is_file()}


@pytest.mark.parametrize("package", FLOOR_PACKAGES)
def test_a_floors_docstring_lists_exactly_its_rooms(package):
    listed, present = listed_rooms(ROOT / package), rooms(ROOT / package)
    assert not present - listed, f"{package}/__init__.py does not list {sorted(present - listed)}"
    assert not listed - present, f"{package}/__init__.py lists {sorted(listed - present)}, which do not exist"


@pytest.mark.parametrize(
    "package",
    sorted(
        {str(path.parent.relative_to(ROOT)) for package in PACKAGES for path in (ROOT / package).rglob("__init__.py")}
    ),
)
def test_a_package_docstring_names_only_files_that_exist(package):
    missing = sorted(listed_rooms(ROOT / package) - rooms(ROOT / package))
    assert not missing, f"{package}/__init__.py names {missing}, which do not exist"


def test_a_docstring_that_lists_a_removed_room_fails(tmp_path):
    write(tmp_path, {"pkg/__init__.py": '"""- `cpu.py`: gone.\n- `kept.py`: here."""\n', "pkg/kept.py": ""})
    assert listed_rooms(tmp_path / "pkg") - rooms(tmp_path / "pkg") == {"cpu.py"}
    write(tmp_path, {"pkg/new.py": ""})
    assert rooms(tmp_path / "pkg") - listed_rooms(tmp_path / "pkg") == {"new.py"}


def test_the_file_table_names_every_module():
    """docs/architecture.md's file table names every module of the package and of converters/: by its path, by its
    bare name after a path in its folder (`outputs.py`), or within a folder row (`hfbert/tools/parity/`). A new file
    without a row fails here."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    table = text[text.index("## Files") :]
    rows = [line for line in table.splitlines() if line.startswith("| `")]
    missing = []
    for module in sorted([*(ROOT / "hfbert").rglob("*.py"), *(ROOT / "converters").rglob("*.py")]):
        path = module.relative_to(ROOT).as_posix()
        if module.name == "__init__.py":
            continue
        folder = path.rpartition("/")[0] + "/"
        named = any(
            f"`{path}`" in row
            or (f"`{module.name}`" in row and f"`{folder}" in row)
            or any(path.startswith(room) for room in re.findall(r"`([\w/]+/)`", row.split("|")[1]))
            for row in rows
        )
        if not named:
            missing.append(path)
    assert not missing, f"docs/architecture.md's file table has no row for {missing}"
