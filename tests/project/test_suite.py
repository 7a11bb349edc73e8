"""The test suite's own contract: tests/ is laid out like the package,
every test file or test a page, a module or another test cites exists, and
the requirement markers say what each test needs (no bare skips; a test
that runs DeepSpeed or fio without its marker fails)."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from tests.conftest import _GUARD
from tests.requirements import USES, deepspeed_in, fio_in, loaded_train_packages, unmarked_use, without_deepspeed

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


# ---- requirement markers, not bare skips -------------------------------------

# A skip condition that names a requirement marker's subject: DeepSpeed and its
# packages, fio, root, BPF. Such a test takes the marker instead
# (tests/conftest.py), so that `-m "not deepspeed"` and the like leave it out.
REQUIREMENT = re.compile(r"""find_spec\(\s*["'](?:deepspeed|torch|transformers|bcc)["']|"""
                         r"""which\(\s*["']fio["']|geteuid\(\)|\b_NO_(?:TRAIN|FIO|BPF)\b|"""
                         r"""\bmissing_for_(?:root|bpf|tracing|train|fio)\(""")
REQUIREMENT_PACKAGES = {"deepspeed", "torch", "transformers", "bcc"}


def _source_with_definitions(node: ast.AST, text: str, defined: dict[str, ast.AST]) -> str:
    """`node`'s source, followed by the source of every module-level name
    and function of its file that it uses, transitively."""
    seen: set[str] = set()
    parts, todo = [], [node]
    while todo:
        current = todo.pop()
        parts.append(ast.get_source_segment(text, current) or "")
        for name in {n.id for n in ast.walk(current) if isinstance(n, ast.Name)} - seen:
            seen.add(name)
            if name in defined:
                todo.append(defined[name])
    return "\n".join(parts)


def bare_requirement_skips(text: str) -> list[tuple[int, str]]:
    """(line, call) of each skipif, skip or importorskip in `text` (a test
    module's source) whose condition is a requirement marker's subject."""
    tree = ast.parse(text)
    defined: dict[str, ast.AST] = {}
    for top in tree.body:
        if isinstance(top, (ast.FunctionDef, ast.ClassDef)):
            defined[top.name] = top
        elif isinstance(top, (ast.Assign, ast.AnnAssign)):
            for target in top.targets if isinstance(top, ast.Assign) else [top.target]:
                if isinstance(target, ast.Name):
                    defined[target.id] = top
    parents = {child: parent for parent in ast.walk(tree) for child in ast.iter_child_nodes(parent)}
    found = []
    for call in (n for n in ast.walk(tree) if isinstance(n, ast.Call)):
        name = ast.unparse(call.func)
        if name.endswith("mark.skipif") and call.args:
            condition: ast.AST | None = call.args[0]
        elif name.endswith("importorskip") and call.args:
            if isinstance(call.args[0], ast.Constant) and call.args[0].value in REQUIREMENT_PACKAGES:
                found.append((call.lineno, ast.unparse(call)))
            continue
        elif name in ("pytest.skip", "skip"):
            condition = next((p.test for p in _ancestors(call, parents) if isinstance(p, ast.If)), None)
        else:
            continue
        local = dict(defined)
        for scope in (p for p in reversed(_ancestors(call, parents)) if isinstance(p, ast.FunctionDef)):
            local.update({t.id: a for a in ast.walk(scope) if isinstance(a, ast.Assign)
                          for t in a.targets if isinstance(t, ast.Name)})
        if condition is not None and REQUIREMENT.search(_source_with_definitions(condition, text, local)):
            found.append((call.lineno, ast.unparse(call)))
    return found


def _ancestors(node: ast.AST, parents: dict[ast.AST, ast.AST]) -> list[ast.AST]:
    out = []
    while node in parents:
        node = parents[node]
        out.append(node)
    return out


@pytest.mark.parametrize("source", [
    'needs_ds = pytest.mark.skipif(importlib.util.find_spec("deepspeed") is None, reason="")',
    'HAVE = importlib.util.find_spec("torch") is not None\nx = pytest.mark.skipif(not HAVE, reason="")',
    'def _missing():\n    if os.geteuid() != 0:\n        return "root"\n@pytest.mark.skipif(_missing() is not None, reason="")\ndef test_x(): pass',
    'def test_x():\n    if shutil.which("fio") is None:\n        pytest.skip("needs fio")',
    'torch = pytest.importorskip("torch")',
    'def f():\n    if _NO_TRAIN:\n        pytest.skip(_NO_TRAIN)',
    'def f():\n    spec = importlib.util.find_spec("deepspeed")\n    if spec is None:\n        pytest.skip("no")',
])
def test_a_bare_skip_on_a_requirement_is_found(source: str) -> None:
    assert len(bare_requirement_skips(source)) == 1


@pytest.mark.parametrize("source", [
    'x = pytest.mark.skipif(shutil.which("mkfs.btrfs") is None, reason="needs mkfs.btrfs")',
    'def test_x(loop):\n    if not Path("/dev/fuse").exists():\n        pytest.skip("needs /dev/fuse")',
    'HAVE = importlib.util.find_spec("pyarrow") is not None\nx = pytest.mark.skipif(not HAVE, reason="")',
])
def test_a_skip_on_something_else_is_left_alone(source: str) -> None:
    assert bare_requirement_skips(source) == []


def test_no_test_skips_on_a_requirement_without_its_marker() -> None:
    """root, bpf, fio and deepspeed are markers (tests/conftest.py turns
    them into skips naming what is missing): a test module's own skipif,
    skip or importorskip on one of them would hide the test from
    `-m "not deepspeed"` and the like, and from the slow tier."""
    found = [f"{p.relative_to(ROOT)}:{line}: {call}" for p in sorted(TESTS.rglob("test_*.py"))
             for line, call in bare_requirement_skips(p.read_text())]
    assert not found, "use the requirement marker instead:\n" + "\n".join(found)


# ---- the guard that keeps the deepspeed and fio markers true -------------------

@pytest.mark.parametrize("argv,why", [
    ([sys.executable, "-W", "ignore", "-m", "iotune.workloads.train", "--steps", "3"], "runs iotune.workloads.train"),
    ([sys.executable, "-m", "iotune.sweep.aio.bench", "--dir", "/x"], "runs iotune.sweep.aio.bench"),
    (["setpriv", "--inh-caps=-ipc_lock", sys.executable, "-m", "iotune", "sweep", "--steps-cmd",
      "python -m iotune.workloads.train --ds-config {config}"], "runs iotune.workloads.train"),
    ([sys.executable, "-c", "from deepspeed.accelerator import get_accelerator"], "runs Python code that imports deepspeed"),
    ("sh -c 'python -c \"import torch\"'", "runs Python code that imports torch"),
    ([sys.executable, str(TESTS / "data" / "gpt_job.py")], f"runs {TESTS / 'data' / 'gpt_job.py'}, which imports DeepSpeed or torch"),
    (without_deepspeed("iotune.sweep.aio.bench", "--dir", "/x"), None),
    ([sys.executable, "-m", "iotune", "trace", "--", "dd", "if=/dev/zero"], None),
    (["fio", "--version"], None),
])
def test_what_runs_deepspeed(argv: object, why: str | None) -> None:
    assert deepspeed_in(argv) == why           # type: ignore[arg-type]


@pytest.mark.parametrize("argv,why", [
    (["/usr/bin/fio", "--output-format=json", "job.fio"], "runs fio (/usr/bin/fio)"),
    (["ssh", "127.0.0.2", "fio --name=t --rw=write"], "runs fio (fio)"),
    (["fio", "--version"], None),
    ([sys.executable, "-m", "iotune", "sweep", "--offload"], None),
])
def test_what_runs_fio(argv: list[str], why: str | None) -> None:
    assert fio_in(argv) == why


def test_the_guard_sees_what_a_test_starts_and_imports(monkeypatch: pytest.MonkeyPatch) -> None:
    """The session's guard itself (one audit hook per session), taken over
    for the length of this test and handed back to its fixture after."""
    assert _GUARD.stop(loaded_train_packages()) == []                  # nothing of this test's own so far
    try:
        before = _GUARD.start(["fio", "deepspeed"])
        with pytest.raises(FileNotFoundError):
            subprocess.run(["/nonexistent/fio", "--rw=read"])        # the audit event comes before the exec
        monkeypatch.setitem(sys.modules, "transformers", sys.modules.get("transformers") or ModuleType("transformers"))
        found = _GUARD.stop(before - {"transformers"})
        subprocess.run(["/bin/true"])
        assert _GUARD.stop(_GUARD.start([])) == []                    # a test with both markers: nothing to see
    finally:
        _GUARD.start(USES)                                            # for this test's own guard fixture
    assert found == [("deepspeed", "imports transformers into the test process"),
                     ("fio", "runs fio (/nonexistent/fio)")]
    assert unmarked_use(found, "t.py::test_x") == (
        't.py::test_x imports transformers into the test process without the deepspeed marker: add '
        '@needs_deepspeed (tests.conftest), so that it skips where deepspeed is missing and `-m "not deepspeed"` '
        'leaves it out; t.py::test_x runs fio (/nonexistent/fio) without the fio marker: add @needs_fio '
        '(tests.conftest), so that it skips where fio is missing and `-m "not fio"` leaves it out')


def test_the_slow_tables_name_tests_that_exist() -> None:
    """conftest's SLOW_MODULES and SLOW_TESTS key by path: a moved or renamed
    test would silently fall into the quick tier."""
    from tests.conftest import SLOW_MODULES, SLOW_TESTS

    assert [m for m in sorted(SLOW_MODULES) if not (ROOT / m).is_file()] == []
    stale = []
    for nodeid in sorted(SLOW_TESTS):
        path, name = nodeid.split("::")
        if not (ROOT / path).is_file() or not re.search(rf"^def {name}\(", (ROOT / path).read_text(), re.MULTILINE):
            stale.append(nodeid)
    assert stale == []
