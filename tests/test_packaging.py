"""What the wheel installs: one import name, ``memmesh``, with its data files, and nothing that
imports the repository's folder names (auth, crdt, tickets, node, integrations) as top-level packages."""
from __future__ import annotations

import ast
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
LAYERS = ("auth", "crdt", "tickets", "node", "integrations")  # lowest first


def _sources() -> list[Path]:
    return [p for layer in LAYERS for p in sorted((REPO / layer).rglob("*.py"))]


def _top_level_imports(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names if a.name.split(".")[0] in LAYERS]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] in LAYERS:
            found.append(str(node.module))
    return found


def test_the_code_imports_itself_only_under_memmesh():
    """An import of ``node.x`` works from a checkout (the folder is on the path) and breaks in
    the installed wheel, where only ``memmesh.node.x`` exists: none may be left."""
    sources = _sources()
    assert len(sources) > 100
    stray = {str(p.relative_to(REPO)): names for p in sources if (names := _top_level_imports(p))}
    assert stray == {}


def test_each_layer_is_linked_under_memmesh():
    for layer in LAYERS:
        link = REPO / "memmesh" / layer
        assert link.is_symlink() and link.resolve() == (REPO / layer).resolve(), layer


@pytest.mark.slow
def test_the_wheel_installs_only_memmesh(tmp_path):
    # Built from a copy: a build writes build/ and *.egg-info next to the sources.
    src = tmp_path / "src"
    shutil.copytree(REPO, src, symlinks=True, ignore=shutil.ignore_patterns(
        ".git", ".venv", "build", "*.egg-info", "__pycache__", ".*_cache", ".hypothesis", "bench", "tests"))
    out = tmp_path / "dist"
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(out), str(src)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    (wheel,) = out.glob("memmesh-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names}
    assert {t for t in tops if not t.endswith(".dist-info")} == {"memmesh"}
    for layer in LAYERS:
        assert f"memmesh/{layer}/__init__.py" in names
    # The data the node reads at run time: the cockpit page and the embedder's vocabulary files.
    assert any(n.startswith("memmesh/node/api/static/") for n in names)
    assert any(n.startswith("memmesh/node/memory/embedders/data/") for n in names)
    entry_points = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith("entry_points.txt"))).decode()
    assert "memmesh = memmesh.node.cli:main" in entry_points


@pytest.mark.slow
def test_the_sdist_holds_what_the_readme_links_to_and_builds_without_deprecations(tmp_path):
    """The source distribution, built as a PEP 517 front end builds it (the build system
    pyproject.toml requires, in a place of its own): every file the README links to is in it,
    and nothing in the build warns of a deprecation (as a license table once did, four times)."""
    import os
    import re
    import tarfile

    src = tmp_path / "src"
    shutil.copytree(REPO, src, symlinks=True, ignore=shutil.ignore_patterns(
        ".git", ".venv", "build", "*.egg-info", "__pycache__", ".*_cache", ".hypothesis"))
    backend = tmp_path / "backend"
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--target", str(backend),
                           "setuptools>=77"], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = tmp_path / "dist"
    out.mkdir()
    build = subprocess.run([sys.executable, "-c", f"from setuptools import build_meta; build_meta.build_sdist({str(out)!r})"],
                           cwd=src, env={**os.environ, "PYTHONPATH": str(backend)},
                           capture_output=True, text=True, timeout=600)
    assert build.returncode == 0, build.stderr[-2000:]
    log = build.stdout + build.stderr
    assert "deprecat" not in log.lower(), log[-3000:]
    (sdist,) = out.glob("memmesh-*.tar.gz")
    with tarfile.open(sdist) as tar:
        names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
    linked = set(re.findall(r"\]\(((?:docs|examples)/[^)#]+)\)", (REPO / "README.md").read_text()))
    assert linked and linked <= names, sorted(linked - names)
    assert {"docs/cockpit.png", "examples/agent_loop.py", "Makefile", ".importlinter", "tests/conftest.py"} <= names
    assert {str(p.relative_to(REPO)) for p in (REPO / "docs").iterdir()} <= names


def test_the_floors_contract_names_every_linked_folder_in_order():
    """Each folder linked under memmesh/ is one floor of .importlinter's root contract, in the
    order of LAYERS (a folder left out would be held to no floor)."""
    import configparser

    cfg = configparser.ConfigParser()
    cfg.read(REPO / ".importlinter")
    floors = [line.strip() for line in cfg["importlinter:contract:floors"]["layers"].split("\n") if line.strip()]
    assert floors == [f"memmesh.{layer}" for layer in reversed(LAYERS)]
    linked = {p.name for p in (REPO / "memmesh").iterdir() if p.is_symlink()}
    assert linked == set(LAYERS)


def test_every_module_of_node_stands_on_a_floor():
    """A module left out of .importlinter's node contract would be held to no floor at all: a
    new module must be given its place there."""
    import configparser

    cfg = configparser.ConfigParser()
    cfg.read(REPO / ".importlinter")
    listed = {name.strip() for line in cfg["importlinter:contract:node"]["layers"].split("\n")
              for name in line.replace("|", ":").split(":") if name.strip()}
    present = {p.stem for p in (REPO / "node").glob("*.py") if p.stem != "__init__"}
    present |= {p.name for p in (REPO / "node").iterdir() if (p / "__init__.py").exists()}
    assert present - listed == set()
    assert listed - present == set()
