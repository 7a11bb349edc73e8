"""One command line: walking every command of `iotune`, a short option
means one thing everywhere, -o is always --out, every command that prints
results takes --json, help does not depend on the machine it runs on, and
`iotune --version` prints the package's version."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from importlib.metadata import version
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

import iotune
from iotune.cli import cli

ROOT = Path(__file__).resolve().parents[2]

# Commands that print no result, each with the reason. Every other command takes --json.
NO_JSON = {
    "agent": "hidden: the multi-node trace's agent writes its run to stdout as a tar stream, for `iotune trace "
             "--hosts`",
}


def commands(group: click.Group = cli, prefix: str = "") -> Iterator[tuple[str, click.Command]]:
    """(name, command) of every command under `group`, sub-commands as `volumes build`."""
    ctx = click.Context(group)
    for name in group.list_commands(ctx):
        command = group.get_command(ctx, name)
        assert command is not None
        full = f"{prefix}{name}"
        if isinstance(command, click.Group):
            yield from commands(command, f"{full} ")
        else:
            yield full, command


def options(command: click.Command) -> Iterator[click.Option]:
    yield from (p for p in command.params if isinstance(p, click.Option))


def long_name(option: click.Option) -> str:
    return max((o for o in [*option.opts, *option.secondary_opts] if o.startswith("--")), key=len)


def test_a_short_option_means_one_thing_everywhere() -> None:
    meanings: dict[str, set[str]] = {}
    for name, command in commands():
        for option in options(command):
            for short in (o for o in option.opts if not o.startswith("--")):
                meanings.setdefault(short, set()).add(long_name(option))
    assert meanings, "no short options found: the walk is broken"
    assert {short: names for short, names in meanings.items() if len(names) > 1} == {}
    assert meanings["-o"] == {"--out"}


def test_minus_o_is_always_out() -> None:
    for name, command in commands():
        for option in options(command):
            if "-o" in option.opts or "--out" in option.opts:
                assert option.opts == ["-o", "--out"], (name, option.opts)


def test_every_command_that_prints_results_takes_json() -> None:
    names = dict(commands())
    assert set(NO_JSON) <= set(names), "an exempt command no longer exists: drop it from NO_JSON"
    lacking = [name for name, command in names.items()
               if name not in NO_JSON and not any("--json" in o.opts for o in options(command))]
    assert lacking == []
    assert {"volumes scratch", "volumes bed", "volumes build", "schema", "trace", "sweep aio", "sweep offload",
            "sweep checkpoint", "sweep layouts", "sweep netfs"} <= set(names)


def test_version_is_the_package_version() -> None:
    r = CliRunner().invoke(cli, ["--version"])
    assert r.exit_code == 0 and r.stdout == f"iotune {version('iotune')}\n"
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["version"] == iotune.__version__ == version("iotune")


def test_renamed_options_still_work_hidden_with_a_warning() -> None:
    for name, command in commands():
        for option in options(command):
            if "--threads" in option.opts or "--cap" in option.opts:
                assert option.hidden, (name, option.opts)
    r = CliRunner().invoke(cli, ["sweep", "--threads", "0"])
    assert r.exit_code == 2 and "Invalid value for '--threads': '0': expected a whole number >= 1" in r.stderr
    r = CliRunner().invoke(cli, ["sweep", "--threads", "1", "--aio-threads", "2"])
    assert r.exit_code == 2 and r.stderr.endswith("Error: --threads is the old spelling of --aio-threads: give "
                                                  "--aio-threads only\n")
    r = CliRunner().invoke(cli, ["demo", "--cap", "100MB/s", "--bed", "builtin"])
    assert r.exit_code == 2
    assert r.stderr.startswith("warning: --cap is deprecated and will be removed in the next release: use "
                               "--drive-cap\n")
    assert r.stderr.endswith("Error: --bed builtin runs on the bed's own drives and limits, not on a capped "
                             "scratch drive: drop --drive-cap, or drop --bed\n")


DUMP_HELP = """
import json, os, sys
n = int(sys.argv[1])
os.cpu_count = lambda: n
os.sched_getaffinity = lambda pid: set(range(n))
import click
import pytest
from iotune.cli import cli
def walk(group, prefix):
    ctx = click.Context(group, info_name=prefix.strip() or "iotune")
    out = {prefix.strip(): group.get_help(ctx)}
    for name in group.list_commands(ctx):
        sub = group.get_command(ctx, name)
        if isinstance(sub, click.Group):
            out.update(walk(sub, prefix + name + " "))
        else:
            out[prefix + name] = sub.get_help(click.Context(sub, info_name=name, parent=ctx))
    return out
print(json.dumps(walk(cli, "")))
"""


def help_texts(tmp: Path, cpus: int, user: str) -> dict[str, str]:
    env = {**os.environ, "HOME": str(tmp), "TMPDIR": str(tmp), "USER": user, "LOGNAME": user, "SUDO_USER": user,
           "COLUMNS": "100", "PYTHONPATH": str(ROOT)}
    for key in [k for k in env if k.startswith("SLURM_")]:
        del env[key]
    r = subprocess.run([sys.executable, "-c", DUMP_HELP, str(cpus)], cwd=tmp, env=env, capture_output=True,
                       text=True, check=True)
    return json.loads(r.stdout)


def test_help_does_not_depend_on_the_machine(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    one = help_texts(tmp_path / "a", 1, "alice")
    other = help_texts(tmp_path / "b", 96, "bob")
    assert len(one) > 10 and "sweep" in one and "volumes build" in one
    assert {name: text for name, text in one.items() if other[name] != text} == {}


INERT = [
    (["sweep", "--in-place"], "--in-place says where --apply writes: add --apply DS_CONFIG, or drop --in-place"),
    (["sweep", "--drive-cap", "100MB/s"], "--drive-cap is not an option of `iotune sweep aio`: it belongs to "
                                          "`iotune sweep layouts`"),
    (["sweep", "layouts", "--drives", "2", "--export", "t.csv"],
     "--export is not an option of `iotune sweep layouts`: it belongs to `iotune sweep aio`"),
    (["sweep", "layouts", "--drives", "2", "--path", "."],
     "--path is not an option of `iotune sweep layouts`: it belongs to `iotune sweep aio`, `iotune sweep offload`, "
     "`iotune sweep checkpoint` and `iotune sweep netfs`"),
    (["sweep", "netfs", "--path", ".", "--dry-run", "--json"],
     "--dry-run prints the commands a netfs sweep would run, as text: drop --json"),
    (["sweep", "offload", "--executor", "aio"],
     "--executor is not an option of `iotune sweep offload`: it belongs to `iotune sweep aio`, `iotune sweep "
     "layouts` and `iotune sweep netfs`"),
    (["sweep", "offload", "--block-sizes", "1M", "--repeats", "2"],
     "--block-sizes is not an option of `iotune sweep offload`: it belongs to `iotune sweep aio`, `iotune sweep "
     "checkpoint`, `iotune sweep layouts` and `iotune sweep netfs`; here, pin the aio block with --fix "
     "aio.block_size=1M"),
    (["sweep", "--what-if", "grad_accum=1,2"], "--what-if is not an option of `iotune sweep aio`: it belongs to "
                                               "`iotune sweep offload`"),
    (["sweep", "--remote-iotune", "/opt/iotune"],
     "--remote-iotune is for a multi-node sweep: add --hosts, --hostfile or --slurm, or drop --remote-iotune"),
    (["sweep", "layouts", "--drives", "1", "--omp-threads", "1"],
     "--omp-threads is not an option of `iotune sweep layouts`: it belongs to `iotune sweep aio`"),
    (["sweep", "layouts", "--drives", "1", "--steps", "3"],
     "--steps is not an option of `iotune sweep layouts`: it belongs to `iotune sweep aio`, `iotune sweep offload` "
     "and `iotune sweep checkpoint`"),
    (["sweep", "--profile", "quick", "--steps", "3"],
     "--steps sets the training-step trials, and this sweep runs none (--confirm 0 / confirm_top = 0 in profile "
     "quick): give --confirm 1 or more, or drop --steps"),
    (["trace", "--no-save", "-o", "run", "--", "true"],
     "-o/--out says where to save the run, and --no-save not to save it: drop one of them"),
    (["trace", "--duration", "1", "--linger", "2"],
     "--linger is about the traced command, and --duration traces a time window with none: drop --linger, or "
     "give a command after `--`"),
    (["trace", "--duration", "1", "--as-root"],
     "--as-root is about the traced command, and --duration traces a time window with none: drop --as-root, or "
     "give a command after `--`"),
    (["trace", "--json", "--width", "100", "--", "true"],
     "--width sets the console report's width, and --json prints no console report: drop --width"),
    (["trace", "--remote-iotune", "/opt/iotune", "--", "true"],
     "--remote-iotune is for a multi-node trace: add --hosts, --hostfile or --slurm, or drop --remote-iotune"),
    (["demo", "--workload", "fio", "--steps", "3"],
     "--steps counts training steps; --workload fio runs a fixed fio job: drop --steps, or use --workload train"),
    (["plan", "--params", "1000", "--aio-block-size", "2M"],
     "--aio-block-size decides which tensors of a --model shape are swapped; a --params count has no tensors: "
     "give --model PRESET, or drop --aio-block-size"),
    (["doctor", "--gpus", "2"], "--gpus goes with --ds-config FILE (the job's checks): add --ds-config, or drop "
                                "--gpus"),
    (["doctor", "--ds-config", "ds.json", "--path", "."],
     "--ds-config checks O_DIRECT on the config's own nvme_path: drop --path (or drop --ds-config to check --path "
     "with the machine's checks)"),
    (["volumes", "build", "/dev/null", "--chunk", "1M"],
     "--chunk sets how --raid0 stripes the devices: add --raid0, or drop --chunk"),
    (["volumes", "build", "/dev/null", "--raid0"],
     "--raid0 stripes two or more devices: give more DEVICES, or drop --raid0"),
    (["volumes", "build", "a", "b", "--raid0", "--backend", "btrfs", "--fs", "xfs"],
     "--backend btrfs builds a btrfs raid0, not xfs: drop --fs xfs, or use --backend md"),
    (["schema", "run", "--path", "--validate", __file__],
     "--path prints where the schema is, --validate checks files against it: give one"),
]


@pytest.mark.parametrize("argv,message", INERT, ids=[" ".join(a) for a, _ in INERT])
def test_inert_or_contradictory_options_are_refused_with_the_fix(argv: list[str], message: str) -> None:
    r = CliRunner().invoke(cli, argv)
    assert r.exit_code == 2, r.output
    assert r.stderr.splitlines()[-1] == f"Error: {message}", r.stderr
    assert r.stdout == "" and "Traceback" not in r.output


def test_params_takes_model_sizes_as_people_write_them() -> None:
    """--params 16B is 16e9 parameters, the same plan as the digits (and 7e9, 350M, 1.5B); a size in
    bytes is refused naming the forms it takes."""
    def plan_json(params: str) -> dict[str, object]:
        r = CliRunner().invoke(cli, ["plan", "--params", params, "--json"])
        assert r.exit_code == 0, r.stderr
        return dict(json.loads(r.stdout))

    assert plan_json("16B") == plan_json("16000000000")
    assert plan_json("1.5B") == plan_json("1500000000") != plan_json("350M")
    assert plan_json("7e9") == plan_json("7000000000")
    r = CliRunner().invoke(cli, ["plan", "--params", "16GB"])
    assert r.exit_code == 2 and r.stdout == ""
    assert r.stderr.endswith("Invalid value for '--params': '16GB' is not a parameter count: write it as 16B, "
                             "1.5B, 350M, 7e9 or 8000000000 (K, M, B, T: thousand, million, billion, trillion)\n")


@pytest.mark.parametrize("argv", [["plan", "--model", "tiny", "--params", "5"],
                                  ["doctor", "--ds-config", "ds.json", "--model", "tiny", "--params", "5"],
                                  ["lint", __file__, "--model", "tiny", "--params", "5"]])
def test_model_size_has_one_rule(argv: list[str], tmp_path: Path) -> None:
    """--model and --params: plan, doctor and lint take one of them, never both."""
    (tmp_path / "ds.json").write_text("{}")
    argv = [str(tmp_path / "ds.json") if a == "ds.json" or a == __file__ else a for a in argv]
    r = CliRunner().invoke(cli, argv)
    assert r.exit_code == 2 and r.stderr == "Error: give the model as --model PRESET or --params N, not both\n"
