"""The test suite's own contract: tests/ is laid out like the package, and
every test file or test a page, a module or another test cites exists."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TESTS = ROOT / "tests"

# "tests/sweep/test_sweep_cli.py", optionally followed by "::test_name"; a
# "::test_name" after it on the same line (a table cell listing several tests
# of one file) names a test of the last file cited on that line.
CITATION = re.compile(r"\btests/((?:[\w-]+/)*test_\w+\.py)|::(test_\w+)")
# docs/lint-corpus.md's table rows cite other repositories' tests
OTHER_REPO_ROW = re.compile(r"^\| \d+ \| [\w-]+/[\w.-]+ \|")
SCANNED = ("README.md", "Makefile", "pyproject.toml", "mkdocs.yml", ".ci/run")
SCANNED_DIRS = ("docs", "iotune", "probes", "profiles", "scripts", "benchmarks", "tests")
SUFFIXES = {".md", ".py", ".toml", ".yml", ".h", ".c", ".sh"}


def _scanned_files() -> list[Path]:
    files = [ROOT / f for f in SCANNED if (ROOT / f).is_file()]
    for d in SCANNED_DIRS:
        files += [p for p in sorted((ROOT / d).rglob("*")) if p.suffix in SUFFIXES and p.is_file()]
    return [f for f in files if f != Path(__file__).resolve()]     # this file's own examples


def citations(lines: list[str]) -> list[tuple[int, str, str | None]]:
    """(line number, test file, test name or None) for each citation."""
    out: list[tuple[int, str, str | None]] = []
    for n, line in enumerate(lines, 1):
        if OTHER_REPO_ROW.match(line):
            continue
        last = None
        for m in CITATION.finditer(line):
            if m.group(1):
                last = m.group(1)
                out.append((n, last, None))
            elif last is not None:
                out.append((n, last, m.group(2)))
    return out


def test_the_citation_pattern_reads_a_table_cell() -> None:
    cell = ("| `tests/host/test_leftovers.py::test_a_command_killed_at_random_leaves_nothing` (...), "
            "`::test_doctor_names_what_a_killed_scratch_left_and_fix_removes_only_that`, `[sweep --path]` |")
    assert citations([cell]) == [(1, "host/test_leftovers.py", None),
                                 (1, "host/test_leftovers.py", "test_a_command_killed_at_random_leaves_nothing"),
                                 (1, "host/test_leftovers.py",
                                  "test_doctor_names_what_a_killed_scratch_left_and_fix_removes_only_that")]
    assert citations(["| 01 | deepspeedai/DeepSpeed | tests/unit/runtime/zero/test_nvme_checkpointing.py |"]) == []
    assert citations(["see tests/test_sweep.py"]) == [(1, "test_sweep.py", None)]


def test_every_cited_test_file_and_test_exists() -> None:
    stale = []
    for path in _scanned_files():
        for n, cited, name in citations(path.read_text(errors="replace").splitlines()):
            target = TESTS / cited
            where = f"{path.relative_to(ROOT)}:{n}: tests/{cited}"
            if not target.is_file():
                stale.append(f"{where} does not exist")
            elif name is not None and not re.search(rf"^(?:async )?def {name}\(", target.read_text(), re.MULTILINE):
                stale.append(f"{where}::{name}: no such test")
    assert not stale, "\n".join(stale)


def test_the_suite_is_laid_out_like_the_package() -> None:
    """No test module at the top of tests/ (shared helpers stay there), each
    sub-directory a package, and each named after a package of iotune
    except the suite's own: beds (the test beds) and project (docs,
    packaging, layering, typing, schemas)."""
    assert sorted(p.name for p in TESTS.glob("test_*.py")) == []
    dirs = {p.parent for p in TESTS.rglob("test_*.py")}
    assert all((d / "__init__.py").is_file() for d in dirs), "each test directory is a package"
    packages = {p.name for p in (ROOT / "iotune").iterdir() if (p / "__init__.py").is_file()}
    assert {d.relative_to(TESTS).parts[0] for d in dirs} - packages == {"beds", "project"}


@pytest.mark.parametrize("line,found", [("`tests/analysis/test_lint.py` lints", "analysis/test_lint.py"),
                                        ("tests.beds.nodes, tests/nodebed.py", None)])
def test_the_citation_pattern_names_test_files_only(line: str, found: str | None) -> None:
    assert [c[1] for c in citations([line])] == ([found] if found else [])
