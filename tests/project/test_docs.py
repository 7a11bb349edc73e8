"""The documentation: the README stays short and true to what CI runs, the
docs site builds with `mkdocs build --strict`, its generated CLI reference
names every command and option, and the hand-drawn parts (exit codes, the
import graph, the profile keys) agree with the code."""

from __future__ import annotations

import ast
import dataclasses
import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import click
import pytest

from iotune.cli import cli
from iotune.sweep.space import RunSettings, SearchSpace

from tests.conftest import needs_deepspeed, needs_root_for

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
README_MAX_BYTES = 8192

# Citations of the project's unpublished background material by number
# ("background document 001", "Document 001's table", "doc 001") or by
# name ("the background documents"): user-facing text cites public sources.
INTERNAL_CITATION = re.compile(r"\b(?:background\s+)?doc(?:ument)?s?\.?\s*0\d\d\b|\bbackground\s+doc(?:ument)?s?\b",
                               re.IGNORECASE)


def _user_facing_files() -> list[Path]:
    files = [README, ROOT / "mkdocs.yml", *DOCS.rglob("*.md")]
    for top in ("iotune", "schemas", "probes", "profiles"):
        d = ROOT / top
        if d.is_dir():
            files += [p for p in d.rglob("*") if p.suffix in {".py", ".json", ".c", ".h", ".toml", ".md"}]
    return files


def test_readme_is_at_most_8_kib() -> None:
    size = len(README.read_bytes())
    assert size <= README_MAX_BYTES, (f"README.md is {size} bytes, over {README_MAX_BYTES}: move detail into a "
                                      f"docs/ page and link it")


def test_readme_quick_start_is_what_ci_and_make_run() -> None:
    readme = README.read_text()
    assert "```\nmake demo\nmake test\n```" in readme
    ci = (ROOT / ".ci" / "run").read_text()
    assert re.search(r"^make test$", ci, re.MULTILINE), ".ci/run no longer runs the README's `make test`"
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^demo:", makefile, re.MULTILINE) and re.search(r"^test:", makefile, re.MULTILINE)


def test_readme_links_point_at_files_that_exist() -> None:
    targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", README.read_text())
    local = [t for t in targets if "://" not in t]
    assert local, "the README links into docs/"
    missing = [t for t in local if not (ROOT / t).exists()]
    assert not missing, f"README links to missing files: {missing}"


def _between_markers(text: str) -> str:
    m = re.search(r"<!-- exit-codes:start -->\n(.*?)<!-- exit-codes:end -->", text, re.DOTALL)
    assert m, "the exit-codes markers are missing"
    return m.group(1)


def test_exit_code_table_is_the_same_in_readme_and_docs() -> None:
    readme = _between_markers(README.read_text())
    docs = _between_markers((DOCS / "reference" / "exit-codes.md").read_text())
    assert readme == docs
    for code in ("| 0 |", "| 1 |", "| 2 |", "| 126, 127 |", "| 130 |"):
        assert code in readme


@pytest.mark.parametrize("text", ["background document 001's table", "Document 001's 16B table",
                                  "Background doc 001's I/O-pattern", "the background documents' shapes",
                                  "as document 002 says"])
def test_the_citation_pattern_catches_internal_references(text: str) -> None:
    assert INTERNAL_CITATION.search(text)


@pytest.mark.parametrize("text", ["one JSON document, errors included", "docs/guide/report.md",
                                  "arXiv:2104.07857", "documented in 0.19.8"])
def test_the_citation_pattern_leaves_ordinary_words_alone(text: str) -> None:
    assert not INTERNAL_CITATION.search(text)


def test_no_user_facing_text_cites_internal_documents() -> None:
    found = []
    for path in _user_facing_files():
        for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if INTERNAL_CITATION.search(line):
                found.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    assert not found, "cite a public source (paper, DeepSpeed docs, the published post) instead:\n" + "\n".join(found)


# Work-log phrases: docs say what is, for a user, not what happened while they were written
# (who worked when, what changed since, which internal issue asked for it and whether its target was met,
# whose machine ran it). A figure that needs its machine states it once, as a fact of the measurement
# ("measured on a 2-vCPU VM, kernel 6.18"), never as "here" or "ours".
WORK_LOG = re.compile("|".join([
    r"\bthis session\b", r"\bother sessions\b", r"\bsame session\b", r"\bsession \d+\b", r"\bthe brief\b",
    r"\bas of (?:this )?writing\b", r"\bat the time of writing\b",
    r"\b(?:it |which )?now (?:says|shows|prints|reports)\b",
    r"\bnot built yet\b", r"\bnot yet built\b",
    # an internal issue; public ones are named with their repository and #NNNN ("DeepSpeed issue #3062"),
    # and "issue 566 [..]" is a probe event's cost
    r"\bissue[ -]\d+\b(?! \[)", r"\bthis issue\b", r"\bissue targets?\b",
    r"\bthe issue(?:'s| (?:asks|asked|says|said|wants|wanted|lists|listed|requires|required))\b",
    r"\btargets?\b(?:[^.;]|\.(?=\d)){0,50}?\b(?:met|missed)\b",   # "target 1.3x: missed", "the target is met"
    r"\bon this (?:\d+-core |[\w-]+ )?(?:machine|VM)\b", r"\b(?:this|the) project's\b", r"\bthis project\b",
    r"\bthis \d+-core machine\b", r"\bthe (?:test|CI|tests'|project) (?:machine|VM|host)\b",
    r"\bCI machine\b", r"\bthe machine (?:the|our) tests run on\b",
    r"\bwe (?:measured|ran|saw|found|tested|tried|checked|reproduced)\b",
    r"\bour (?:own )?(?:machine|VM|CI|runs?|tests?|bed|hardware|setup|traced)\b",
    r"\b(?:measured|reproduced|tested) here\b",
]), re.IGNORECASE)


@pytest.mark.parametrize("text", ["what this session found", "Other sessions had uncommitted edits",
                                  "Follow-up (session 2)", "because the brief asked for that",
                                  "as of this writing", "the planner's bytes as of writing", "it now says 253 GB",
                                  "What is not built yet", "Issue 14 asks that lint agree",
                                  "on this 2-core machine", "measured on this machine", "about 40 ns on this VM",
                                  "as on this CPU-only machine", "the load from the issue-9 benchmark",
                                  "Before this issue the report took 2 s", "Issue target, within 3 %: met",
                                  "Against the issue's targets:", "The issue asked for biolatency",
                                  "target 1.3×: missed", "the ≤ 0.2 target is **met** on this bed",
                                  "as on this project's CI machine", "failed in this project's runs",
                                  "on the project's 2-vCPU VM", "written for this project",
                                  "On the test machine's CPU", "the machine the tests run on",
                                  "we measured here", "our own traced CPU runs", "reproduced here on the CPU"])
def test_the_work_log_pattern_catches_work_log_phrases(text: str) -> None:
    assert WORK_LOG.search(text)


@pytest.mark.parametrize("text", ["DeepSpeed issue #3062", "an sshd session killed", "doctor checks this machine",
                                  "the verdict says what to change", "built in a moment",
                                  "the issue handler takes 0.96 µs", "issue 566 [549–591], complete 337",
                                  "it probes this machine's devices", "the command runs here",
                                  "#2–#15 are within 5% of #1", "set the target bandwidth with --drive-bandwidth",
                                  "measured on a 2-vCPU VM (kernel 6.18)", "a build on another machine"])
def test_the_work_log_pattern_leaves_documentation_alone(text: str) -> None:
    assert not WORK_LOG.search(text)


EXAMPLE_BLOCK = re.compile(r"<!-- example: [\w-]+ -->\n.*?<!-- /example -->", re.DOTALL)
FENCE_OPEN = re.compile(r"^\s*(`{3,}|~{3,})")


def _without_examples(text: str) -> str:
    """`text` with each generated example block blanked, line for line: what
    iotune prints there ("measured on this machine") is its output, not prose."""
    return EXAMPLE_BLOCK.sub(lambda m: "\n" * m.group(0).count("\n"), text)


def _paragraphs(text: str) -> list[tuple[int, str]]:
    """The prose of a Markdown page as (first line number, text) paragraphs,
    a paragraph's lines joined with spaces so that a phrase split over two
    lines reads as one. Generated example blocks and code fences (commands
    and what they print) are left out; a heading and each table row is a
    paragraph of its own."""
    found: list[tuple[int, str]] = []
    lines: list[str] = []
    start = 0
    fence = ""

    def close() -> None:
        if lines:
            found.append((start, " ".join(lines)))
            lines.clear()

    for n, line in enumerate(_without_examples(text).splitlines(), 1):
        stripped = line.strip()
        if fence:
            fence = "" if stripped.startswith(fence) else fence
            continue
        if m := FENCE_OPEN.match(line):
            close()
            fence = m.group(1)
        elif not stripped:
            close()
        elif stripped.startswith(("|", "#")):
            close()
            found.append((n, stripped))
        else:
            if not lines:
                start = n
            lines.append(stripped)
    close()
    return found


def _work_log_phrases(text: str) -> list[str]:
    return [f"{n}: '{m.group(0)}' in: {para}" for n, para in _paragraphs(text) if (m := WORK_LOG.search(para))]


def test_a_work_log_phrase_split_over_two_lines_is_caught() -> None:
    page = "Intro.\n\nThe figures were measured on this\nmachine, with fio 3.33.\n\nMore.\n"
    assert _work_log_phrases(page) == ["3: 'on this machine' in: The figures were measured on this machine, "
                                       "with fio 3.33."]


def test_code_fences_and_example_blocks_are_not_prose() -> None:
    page = ("```\niotune report  # measured on this machine\n```\n\n<!-- example: demo -->\n```text\n"
            "this session\n```\n<!-- /example -->\nA paragraph\nof two lines.\n")
    assert _paragraphs(page) == [(10, "A paragraph of two lines.")]
    assert _work_log_phrases(page) == []


def test_docs_read_as_documentation_not_a_work_log() -> None:
    found = [f"{path.relative_to(ROOT)}:{hit}" for path in [README, *sorted(DOCS.rglob("*.md"))]
             for hit in _work_log_phrases(path.read_text())]
    assert not found, "say what is, for a user:\n" + "\n".join(found)


def _nav_pages(text: str) -> set[str]:
    nav = text[text.index("\nnav:"):]
    return set(re.findall(r"^\s*-\s.*?([\w/.-]+\.md)\s*$", nav, re.MULTILINE))


def test_every_docs_page_is_in_the_nav() -> None:
    nav = _nav_pages((ROOT / "mkdocs.yml").read_text())
    pages = {str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md")}
    assert pages - nav == set(), "pages missing from mkdocs.yml's nav"
    assert nav - pages == set(), "nav entries without a page"


def test_profile_reference_names_every_key() -> None:
    text = (DOCS / "reference" / "json.md").read_text()
    keys = [f.name for f in dataclasses.fields(SearchSpace)] + [f.name for f in dataclasses.fields(RunSettings)]
    missing = [k for k in keys if f"| `{k}` |" not in text]
    assert not missing, f"docs/reference/json.md does not describe profile keys {missing}"


def _source_import_edges() -> set[tuple[str, str]]:
    """Subpackage -> subpackage imports in iotune/, errors and the package
    root left out (as the diagram says)."""
    edges = set()
    pkg_root = ROOT / "iotune"
    for path in pkg_root.rglob("*.py"):
        parts = path.relative_to(pkg_root).with_suffix("").parts
        if len(parts) == 1 and parts[0] in {"__init__", "__main__"}:
            continue
        src = parts[0]
        package = ["iotune", *parts[:-1]] if parts[-1] != "__init__" else ["iotune", *parts[:-1]]
        for node in ast.walk(ast.parse(path.read_text())):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package[:len(package) - node.level + 1]
                    names = ([".".join([*base, node.module])] if node.module else
                             [".".join([*base, a.name]) for a in node.names])
                else:
                    names = [node.module or ""]
            for name in names:
                bits = name.split(".")
                if bits[0] == "iotune" and len(bits) > 1:
                    dst = bits[1]
                    if dst != src and dst != "errors" and (pkg_root / dst).exists() | (pkg_root / f"{dst}.py").exists():
                        edges.add((src, dst))
    return edges


def test_import_graph_diagram_matches_the_source() -> None:
    text = (DOCS / "how-it-works.md").read_text()
    m = re.search(r"```mermaid\n(.*?)```", text, re.DOTALL)
    assert m, "docs/how-it-works.md has no mermaid diagram"
    drawn = set(re.findall(r"^\s*(\w+) --> (\w+)\s*$", m.group(1), re.MULTILINE))
    real = _source_import_edges()
    assert drawn == real, (f"docs/how-it-works.md's import graph is out of date: "
                           f"missing {sorted(real - drawn)}, no longer true {sorted(drawn - real)}")


def _commands(cmd: click.Command, path: tuple[str, ...]) -> list[tuple[tuple[str, ...], click.Command]]:
    """Every command users see (hidden ones, such as the internal `agent`, left out)."""
    out = [(path, cmd)]
    if isinstance(cmd, click.Group):
        for name in sorted(cmd.commands):
            sub = cmd.commands[name]
            if not sub.hidden:
                out += _commands(sub, (*path, name))
    return out


def _missing_docs_tools() -> list[str]:
    return [m for m in ("mkdocs", "material", "mkdocs_click") if importlib.util.find_spec(m) is None]


@pytest.fixture(scope="module")
def built_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    missing = _missing_docs_tools()
    if missing:
        pytest.skip(f"the docs tools are not installed ({', '.join(missing)}): pip install -e '.[docs]' "
                    f"(scripts/setup.sh does)")
    site = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1",
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    r = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-f", str(ROOT / "mkdocs.yml"),
                        "-d", str(site)], capture_output=True, text=True, cwd=ROOT, env=env, timeout=120)
    assert r.returncode == 0, f"mkdocs build --strict failed:\n{r.stdout}\n{r.stderr}"
    return site


def _sections(page: str) -> dict[str, str]:
    """The CLI reference page cut at each command's heading: id -> its HTML."""
    heads = list(re.finditer(r'<h[1-6] id="(iotune[\w-]*)"', page))
    return {h.group(1): page[h.start():(heads[i + 1].start() if i + 1 < len(heads) else len(page))]
            for i, h in enumerate(heads)}


def test_cli_reference_covers_every_command_and_option(built_site: Path) -> None:
    page = (built_site / "reference" / "cli" / "index.html").read_text()
    sections = _sections(page)
    problems = []
    for path, cmd in _commands(cli, ("iotune",)):
        anchor = "-".join(path)
        if anchor not in sections:
            problems.append(f"{' '.join(path)}: no section")
            continue
        for param in cmd.params:
            if isinstance(param, click.Option) and not param.hidden:
                for opt in [*param.opts, *param.secondary_opts]:
                    if not re.search(rf"(?<![\w-]){re.escape(opt)}(?![\w-])", sections[anchor]):
                        problems.append(f"{' '.join(path)}: option {opt} not in its section")
    assert len(sections) >= 10, f"the CLI reference has only {sorted(sections)}"
    assert not problems, "the generated CLI reference is incomplete:\n" + "\n".join(problems)


def test_built_site_has_every_guide(built_site: Path) -> None:
    for page in ("guide/trace", "guide/report", "guide/sweep", "guide/offload", "guide/layouts", "guide/multi-node",
                 "guide/plan-lint", "guide/beds", "guide/doctor", "faults", "testing", "reference/json",
                 "reference/exit-codes", "how-it-works", "benchmarks", "install"):
        assert (built_site / page / "index.html").is_file(), page


# ---- the guides' example outputs (scripts/docs_examples.py) ----

def _examples_module() -> Any:
    spec = importlib.util.spec_from_file_location("docs_examples", ROOT / "scripts" / "docs_examples.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["docs_examples"] = module            # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


EXAMPLES = _examples_module()


# examples whose command asks the installed DeepSpeed (lint's default --deepspeed)
DEEPSPEED_EXAMPLES = frozenset({"lint", "checkpoint-lint"})


def _example_marks(example: Any) -> list[pytest.MarkDecorator]:
    return ([needs_root_for(example.needs_root)] if example.needs_root else []) + (
        [needs_deepspeed] if example.name in DEEPSPEED_EXAMPLES else [])


@pytest.mark.parametrize("name", [pytest.param(e.name, marks=_example_marks(e)) for e in EXAMPLES.EXAMPLES])
def test_each_example_in_the_guides_is_what_iotune_prints(name: str) -> None:
    """The block between `<!-- example: NAME -->` and `<!-- /example -->` is,
    byte for byte, what the command prints now (run here, or its saved record
    rendered by the CLI's renderers)."""
    [example] = [e for e in EXAMPLES.EXAMPLES if e.name == name]
    text = (DOCS / example.page).read_text()
    found = [m.group("body") for m in EXAMPLES.MARKER.finditer(text) if m.group("name") == name]
    assert len(found) == 1, f"docs/{example.page} should hold example {name} once, between its markers"
    assert found[0] == EXAMPLES.block(example), (
        f"docs/{example.page}: the {name} example is not what iotune prints now; run "
        f"`python scripts/docs_examples.py {name}` and read the diff")


def test_the_examples_show_no_temporary_or_checkout_paths() -> None:
    pages = "\n".join((DOCS / p).read_text() for p in sorted({e.page for e in EXAMPLES.EXAMPLES}))
    blocks = "\n".join(m.group("body") for m in EXAMPLES.MARKER.finditer(pages))
    assert blocks.count("```text") == len(EXAMPLES.EXAMPLES)
    leaked = sorted(set(re.findall(r"(?:/tmp/|/var/tmp/|/work/|/root/|pytest-of-)\S*", blocks)))
    assert leaked == [], f"an example shows a temporary or checkout path: {leaked}"


def test_every_page_example_is_known_to_the_generator() -> None:
    known = {e.name for e in EXAMPLES.EXAMPLES}
    marked = {m.group("name") for p in DOCS.rglob("*.md") for m in EXAMPLES.MARKER.finditer(p.read_text())}
    assert marked == known, f"markers without an example: {sorted(marked - known)}; examples without a place: " \
                            f"{sorted(known - marked)}"


def test_an_excerpt_marks_every_cut() -> None:
    text = "title\n\nVerdict: x\n  more\n\ntable\nrow 1\nrow 2\nrow 3\n\nend"
    assert EXAMPLES.excerpt(text, ("Verdict", 0), ("row 2", 1)) == "…\nVerdict: x\n  more\n…\nrow 2\n…"
    assert EXAMPLES.excerpt(text, ("title", 1)) == "title\n…"
    assert EXAMPLES.excerpt(text, ("table", "row 3"), ("end", 1)) == "…\ntable\nrow 1\nrow 2\n…\nend"


# ---- figures quoted in the prose (scripts/docs_examples.py's FIGURES) ----

def _figure_marks() -> list[tuple[str, str, str]]:
    """(page, figure name, text between the markers) of every figure marker in README.md and docs/."""
    return [(str(path.relative_to(ROOT)), m.group("name"), m.group("body"))
            for path in EXAMPLES.doc_pages() for m in EXAMPLES.FIGURE.finditer(path.read_text())]


@pytest.mark.parametrize("name", [f.name for f in EXAMPLES.FIGURES])
def test_each_figure_in_the_prose_is_what_its_results_file_says(name: str) -> None:
    """Between `<!-- figure: NAME -->` and `<!-- /figure -->` stands, exactly,
    the figure scripts/docs_examples.py reads from its results file."""
    [figure] = [f for f in EXAMPLES.FIGURES if f.name == name]
    shown = [(page, body) for page, mark, body in _figure_marks() if mark == name]
    assert shown, f"figure {name} is quoted nowhere: remove it from FIGURES or mark where the prose quotes it"
    value = figure.produce()
    wrong = [f"{page}: {body!r}" for page, body in shown if body != value]
    assert not wrong, (f"figure {name} is {value!r} in {figure.source}, but the prose says otherwise:\n"
                       + "\n".join(wrong) + f"\nrun `python scripts/docs_examples.py {name}`")


def test_every_figure_marker_names_a_known_figure() -> None:
    known = {f.name for f in EXAMPLES.FIGURES}
    unknown = sorted({f"{page}: {name}" for page, name, _ in _figure_marks() if name not in known})
    assert unknown == [], f"figure markers with no figure in scripts/docs_examples.py: {unknown}"
    opened = sum(p.read_text().count("<!-- figure:") for p in EXAMPLES.doc_pages())
    assert opened == len(_figure_marks()), "a figure marker is not closed by <!-- /figure --> on its line"


# ---- every block that shows output is a generated example ----

FENCE = re.compile(r"^(?P<indent> *)(?P<fence>```+|~~~+)(?P<info>[^\n]*)\n(?P<body>.*?)^(?P=indent)(?P=fence)[ \t]*$",
                   re.DOTALL | re.MULTILINE)
# a line of a command listing: what a reader types, not what a program prints
COMMAND_LINE = re.compile(r"^\s*(?:#|(?:sudo|iotune|\.venv/bin/\S+|python3?|/usr/bin/python3|make|pip|git|deepspeed|"
                          r"torchrun|fio|export|cd|mkdir|mount|umount|dmesg|ulimit|bash|scripts/\S+|apt-get|ssh|"
                          r"sbatch|srun|echo|cat|ls|modprobe|losetup|mkfs\S*|systemctl|grep|rm)(?:\s|$))")
# listings that are neither a command nor a program's output
NOT_OUTPUT = {
    ("docs/how-it-works.md", "cli "),                 # the package's layout, drawn by hand
    ("docs/lint-corpus.md", "iotune lint CONFIG ["),  # a synopsis of the options, drawn by hand
    ("docs/benchmarks-log.md", ""),                   # the dated log quotes outputs as they were on the day
    # not generated yet: a failed demo run (no option of `iotune demo` makes its training fail, so no real
    # run has recorded this output); the only hand-written output left
    ("docs/install.md", "--- the last 1 line of iotune-runs/"),
}


def _shows_output(info: str, body: str) -> bool:
    """A fenced block shows a program's output unless it is code or config
    (its info string names a language other than text/console) or a command
    listing (every line a command, its continuation after a `\\`, a comment or
    blank, and no `$ ` prompt, which introduces output)."""
    if info.strip() not in ("", "text", "console", "shell-session"):
        return False
    continued = False
    for line in body.splitlines():
        if line.startswith("$ "):
            return True
        if not (continued or not line.strip() or COMMAND_LINE.match(line)):
            return True
        continued = line.rstrip().endswith("\\")
    return False


def test_every_block_that_shows_output_is_a_generated_example() -> None:
    """Output in the docs comes from a real run through scripts/docs_examples.py:
    a fenced block that shows output sits between example markers."""
    found = []
    for path in EXAMPLES.doc_pages():
        page = str(path.relative_to(ROOT))
        text = _without_examples(path.read_text())
        for m in FENCE.finditer(text):
            body = m.group("body")
            first = next((line for line in body.splitlines() if line.strip()), "")
            if any(page == p and first.startswith(start) for p, start in NOT_OUTPUT):
                continue
            if _shows_output(m.group("info"), body):
                found.append(f"{page}:{text[:m.start()].count(chr(10)) + 1}: {first[:80]}")
    assert not found, ("output shown by hand: generate it (an Example in scripts/docs_examples.py, between "
                       "'<!-- example: NAME -->' and '<!-- /example -->'), or show only the command:\n"
                       + "\n".join(found))


@pytest.mark.parametrize("info, body", [("", "$ iotune plan --model tiny\nPlan: 1 rank\n"),
                                        ("", "Verdict: Compute-bound\n"), ("console", "Plan: x\n"),
                                        ("text", "sudo iotune doctor\nds_config  FAIL\n")])
def test_the_output_rule_catches_output(info: str, body: str) -> None:
    assert _shows_output(info, body)


@pytest.mark.parametrize("info, body", [("", "sudo iotune trace --path /mnt -- \\\n    deepspeed train.py --x\n"),
                                        ("python", "print(render(x))\n"), ("toml", "confirm_top = 1\n"),
                                        ("", "make demo\nmake test\n"), ("", "# a comment\niotune plan\n")])
def test_the_output_rule_leaves_commands_and_code_alone(info: str, body: str) -> None:
    assert not _shows_output(info, body)


def test_the_capped_runs_verdict_is_the_one_report_ceiling_printed_then() -> None:
    """The report example judges the saved run against the ceiling its
    `--ceiling` probe measured; judged again here, every finding is the one
    the real `report --ceiling --json` gave while the drive was there."""
    then = json.loads((ROOT / "tests" / "data" / "examples" / "run-nvme-opt" / "ceiling-report.json").read_text())
    now = EXAMPLES.capped_report().verdict
    assert [(f.kind, f.headline) for f in now.findings] == [(f["kind"], f["headline"])
                                                            for f in then["verdict"]["findings"]]


def test_each_picture_is_cut_from_a_page_iotune_renders_from_the_saved_records() -> None:
    """scripts/docs_images.py screenshots one element of each page; here each
    page is rendered from the records as the script does, and holds that
    element with a valid chart spec (the screenshot itself needs chromium)."""
    from iotune.render.page import figure_specs

    spec = importlib.util.spec_from_file_location("docs_images", ROOT / "scripts" / "docs_images.py")
    assert spec is not None and spec.loader is not None
    images = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(images)
    for name, (make, selector, _) in images.PICTURES.items():
        page = make()
        assert (ROOT / "docs" / "img" / f"{name}.png").is_file(), name
        assert ("<table" if selector == "table" else 'class="iotune-chart"') in page, name
        assert figure_specs(page), name


# ---- every FAIL row `iotune doctor` can print has a row in docs/troubleshooting.md ----

DOCTOR_CODE = ROOT / "iotune" / "doctor"
TROUBLESHOOTING = DOCS / "troubleshooting.md"


@dataclasses.dataclass(frozen=True)
class DoctorFailure:
    """A `CheckResult(name, "fail", detail, ...)` in iotune/doctor/: the
    check's name as it starts (the literal text before any value), and the
    longest literal part of its detail ("" when the detail is all values:
    an exception's text, a lint finding)."""
    where: str
    name: str
    detail: str


def _literal_parts(node: ast.expr | None) -> list[str]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, ast.JoinedStr):
        return [v.value for v in node.values if isinstance(v, ast.Constant) and isinstance(v.value, str)]
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return _literal_parts(node.left) + _literal_parts(node.right)
    return []


def _assigned(scopes: list[ast.AST], name: str) -> ast.expr | None:
    """What `name` was last assigned in the innermost scope that assigns it:
    anywhere in the function, or at the top of the module."""
    for scope in scopes:
        nodes = ast.walk(scope) if isinstance(scope, ast.FunctionDef) else iter(getattr(scope, "body", []))
        found = [n.value for n in nodes if isinstance(n, ast.Assign)
                 and any(isinstance(t, ast.Name) and t.id == name for t in n.targets)]
        if found:
            return found[-1]
    return None


def _resolved(node: ast.expr | None, scopes: list[ast.AST]) -> ast.expr | None:
    return _assigned(scopes, node.id) if isinstance(node, ast.Name) else node


def _trimmed(text: str) -> str:
    return " ".join(text.split()).strip(" :;,.(")


def doctor_failures() -> list[DoctorFailure]:
    """Every place in iotune/doctor/ that makes a failing check: status
    "fail", or a status computed from the findings (which can be "fail")."""
    from iotune.trace.kernel import KERNEL_FEATURES

    found = []
    for path in sorted(DOCTOR_CODE.glob("*.py")):
        module = ast.parse(path.read_text())
        for func in [n for n in ast.walk(module) if isinstance(n, ast.FunctionDef)]:
            scopes: list[ast.AST] = [func, module]
            for call in [n for n in ast.walk(func) if isinstance(n, ast.Call)]:
                if not (isinstance(call.func, ast.Name) and call.func.id == "CheckResult" and len(call.args) >= 3):
                    continue
                status = call.args[1]
                if not ((isinstance(status, ast.Constant) and status.value == "fail")
                        or (isinstance(status, ast.Name) and status.id == "status")):
                    continue
                where = f"{path.relative_to(ROOT)}:{call.lineno}"
                detail = max(map(_trimmed, _literal_parts(_resolved(call.args[2], scopes))), key=len, default="")
                detail = detail if len(detail) >= 8 else ""
                name_node = call.args[0]
                if isinstance(name_node, ast.Attribute) and name_node.attr == "name":   # a kernel feature's
                    names = [f.name for f in KERNEL_FEATURES]
                else:
                    names = [_trimmed(_literal_parts(_resolved(name_node, scopes))[0])]
                found += [DoctorFailure(where, name, detail) for name in names]
    return found


def _table_rows(text: str, heading: str) -> list[str]:
    """The table rows of the section under `heading`, backquotes dropped."""
    section = text[text.index(heading) + len(heading):]
    if m := re.search(r"^## ", section, re.MULTILINE):
        section = section[:m.start()]
    return [" ".join(line.replace("`", "").split()) for line in section.splitlines() if line.startswith("| ")]


DOCTOR_ROWS_HEADING = "## `iotune doctor`: every FAIL"


def test_doctor_failures_are_found_in_the_code() -> None:
    failures = doctor_failures()
    assert len(failures) >= 30, failures
    assert DoctorFailure("iotune/doctor/checks.py", "bcc importable", "installed for the system Python only") in [
        dataclasses.replace(f, where=f.where.split(":")[0]) for f in failures]


def test_every_doctor_failure_has_a_row_in_troubleshooting() -> None:
    """Each FAIL `iotune doctor` can print (found in iotune/doctor/) is a row
    of troubleshooting.md's doctor table: its check's name in the first
    column, and the literal words of its message in the row."""
    rows = _table_rows(TROUBLESHOOTING.read_text(), DOCTOR_ROWS_HEADING)
    missing = [f"{f.where}: {f.name!r} / {f.detail!r}" for f in doctor_failures()
               if not any(row.split("|")[1].strip().startswith(f.name) and f.detail in row for row in rows)]
    assert not missing, (f"docs/troubleshooting.md's '{DOCTOR_ROWS_HEADING}' table has no row for these FAILs "
                         f"(the check's name first, then the words it prints):\n" + "\n".join(missing))
