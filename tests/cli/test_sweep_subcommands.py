"""`iotune sweep`'s subcommands: each lists and takes only its own options;
an option of another subcommand is a usage error naming the subcommand(s)
that take it; the old spellings still work, with a note; --apply never
writes what another model's trials chose."""

from __future__ import annotations

import re
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from iotune.cli import cli
from iotune.cli.sweep import sweep
from iotune.cli.sweep.groups import HINTS, OLD_MODE_FLAGS

SUBCOMMANDS = list(sweep.commands)


def flags(name: str) -> set[str]:
    """Every visible spelling of every option of subcommand `name`."""
    return {o for p in sweep.commands[name].params if isinstance(p, click.Option) and not p.hidden
            for o in (*p.opts, *p.secondary_opts) if o.startswith("--")} - {"--help"}


def run(*args: str) -> click.testing.Result:
    return CliRunner().invoke(cli, ["sweep", *args])


def test_the_subcommands_are_the_five_kinds_of_tuning() -> None:
    assert SUBCOMMANDS == ["aio", "offload", "checkpoint", "layouts", "netfs"]


@pytest.mark.parametrize("name", SUBCOMMANDS)
def test_help_lists_exactly_the_subcommands_own_options_and_a_worked_example(name: str) -> None:
    result = run(name, "--help")
    assert result.exit_code == 0
    records = [re.match(r"  (?:-\w, )?(--[\w-]+)", line) for line in result.output.splitlines()]
    shown = {m.group(1) for m in records if m}
    assert shown - {"--help"} == flags(name)
    assert f"iotune sweep {name} " in result.output.split("Examples:")[1]


CASES = [(here, flag) for here in SUBCOMMANDS for flag in sorted(set().union(*map(flags, SUBCOMMANDS)) - flags(here))]


@pytest.mark.parametrize(("here", "flag"), CASES, ids=[f"{h}{f}" for h, f in CASES])
def test_an_option_of_another_subcommand_names_the_subcommands_that_take_it(here: str, flag: str) -> None:
    result = run(here, flag, "1")
    homes = [f"`iotune sweep {n}`" for n in SUBCOMMANDS if n != here and flag in flags(n)]
    where = homes[0] if len(homes) == 1 else ", ".join(homes[:-1]) + " and " + homes[-1]
    hint = HINTS.get((here, flag))
    assert result.exit_code == 2
    assert result.output.splitlines()[-1] == (f"Error: {flag} is not an option of `iotune sweep {here}`: it "
                                              f"belongs to {where}" + (f"; {hint}" if hint else ""))


def test_offload_takes_no_block_sizes_and_says_how_to_pin_the_block() -> None:
    result = run("offload", "--block-sizes", "1M")
    assert result.exit_code == 2
    assert "pin the aio block with --fix aio.block_size=1M" in result.output


@pytest.mark.parametrize("name", SUBCOMMANDS)
@pytest.mark.parametrize("flag", sorted(OLD_MODE_FLAGS))
def test_the_old_mode_flags_inside_a_subcommand_name_the_subcommand(name: str, flag: str) -> None:
    result = run(name, flag)
    assert result.exit_code == 2
    assert result.output.splitlines()[-1] == (f"Error: {flag} is a sweep of its own now: run `iotune sweep "
                                              f"{OLD_MODE_FLAGS[flag]}`, not iotune sweep {name} {flag}")


@pytest.mark.parametrize("name", [n for n in SUBCOMMANDS if n != "aio"])
def test_a_subcommand_named_after_options_is_refused_with_the_right_order(name: str) -> None:
    result = run("--steps-cmd", "X", name)
    assert result.exit_code == 2
    assert result.output.splitlines()[-1] == (f"Error: `{name}` is a subcommand: name it first, then its options: "
                                              f"iotune sweep {name} --steps-cmd X")


def test_an_option_value_that_spells_a_subcommand_is_a_value() -> None:
    result = run("--profile", "offload")            # bare sweep is the aio sweep; "offload" is the profile
    assert result.exit_code == 2
    assert "no profile 'offload'" in result.output


def test_bare_sweep_is_the_aio_sweep() -> None:
    assert run("--profile", "nope").output == run("aio", "--profile", "nope").output


@pytest.mark.parametrize(("old", "new"), [(["--offload"], ["offload"]), (["--checkpoint"], ["checkpoint"]),
                                          (["--layouts", "2"], ["layouts", "--drives", "2"]),
                                          (["--layouts=2"], ["layouts", "--drives", "2"]), (["--netfs"], ["netfs"])])
def test_the_old_spellings_still_work_with_a_one_line_note(old: list[str], new: list[str]) -> None:
    sub = new[0]
    given = run(*old, "--profile", "nope") if sub in ("layouts", "netfs") else run(*old, "--apply", "x.json")
    same = run(*new, "--profile", "nope") if sub in ("layouts", "netfs") else run(*new, "--apply", "x.json")
    note = (f"warning: `iotune sweep {old[0].split('=')[0]}` is deprecated and will be removed in the next "
            f"release: use `iotune sweep {sub}`")
    assert given.output.splitlines()[0] == note
    assert "\n".join(given.output.splitlines()[1:]) == same.output.rstrip("\n").replace("\n\n", "\n\n")
    assert given.exit_code == same.exit_code == 2


def test_two_old_mode_flags_are_two_sweeps() -> None:
    result = run("--offload", "--checkpoint")
    assert result.exit_code == 2
    assert result.output.splitlines()[-1] == "Error: --offload and --checkpoint are two sweeps: run one, then the other"


@pytest.mark.parametrize("name", [n for n in SUBCOMMANDS if "--apply" in flags(n)])
def test_apply_without_the_users_job_or_a_named_model_is_refused_and_nothing_written(name: str,
                                                                                     tmp_path: Path) -> None:
    config = tmp_path / "ds_config.json"
    config.write_text('{"train_batch_size": 1}\n')
    result = run(name, "--apply", str(config))
    assert result.exit_code == 2
    assert result.output == (f"Error: --apply {config} would write what a built-in model's trials chose into your "
                             f"config: give --steps-cmd (with --ds-config) so the trials run your own job, or name "
                             f"the built-in model with --model to apply its result on purpose\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ds_config.json"]


def test_apply_is_taken_by_every_subcommand_that_decides_a_config() -> None:
    assert [n for n in SUBCOMMANDS if "--apply" in flags(n)] == ["aio", "offload", "checkpoint"]
