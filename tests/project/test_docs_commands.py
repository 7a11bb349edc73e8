"""Every `iotune` command line in the README and the docs parses with
today's command line: each option it gives exists in the (sub)command it
names. Checked by adding --help, which click handles after parsing every
option and before running anything."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
from click.testing import CliRunner

from iotune.cli import cli

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.S | re.M)


def command_lines(text: str) -> list[str]:
    """The iotune invocations in the fenced blocks of a page: continuation
    lines joined, a leading `$ ` dropped, one entry per `;`-separated command."""
    out = []
    for block in FENCE.findall(text):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.strip().removeprefix("$ ")
            for part in line.split(";"):
                words = part.split()
                if words and any(w.endswith("iotune") for w in words[:3]) and words[0] in (
                        "iotune", "sudo", ".venv/bin/iotune") and " · " not in part:     # not a report's heading
                    out.append(part.strip())
    return out


def iotune_args(line: str) -> list[str]:
    words = shlex.split(line, comments=True)
    at = next(i for i, w in enumerate(words) if w.endswith("iotune"))
    args = words[at + 1:]
    for i, w in enumerate(args):
        if w in ("|", ">", "2>", ">>", "&&"):
            return args[:i]
    return args


CASES = [(page.relative_to(ROOT).as_posix(), line) for page in PAGES for line in command_lines(page.read_text())]


def test_the_pages_have_command_lines_to_check() -> None:
    assert len(CASES) > 40


@pytest.mark.parametrize("page,line", CASES, ids=[f"{p}:{i}" for i, (p, _) in enumerate(CASES)])
def test_each_command_line_in_the_docs_parses(page: str, line: str) -> None:
    args = iotune_args(line)
    if not args or args[0] in ("-h", "--help", "--version"):
        return
    # --help where nothing after it can be taken for a command to run: before `--`, or right after
    # `trace` (whose command is its first positional argument)
    cut = args.index("--") if "--" in args else 1 if args[0] == "trace" else len(args)
    r = CliRunner().invoke(cli, [*args[:cut], "--help", *args[cut:]])
    assert r.exit_code == 0, f"{page}: `{line}` does not parse: {r.output.strip().splitlines()[-1:]}"
