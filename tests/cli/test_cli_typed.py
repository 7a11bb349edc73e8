"""Every command takes its options as typed parameters (option groups,
frozen dataclasses through options.option_group, or plain typed values),
never as `**opts` looked up by string."""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import click
import pytest

from iotune.cli import cli
from iotune.cli.options import option_group

def every_command(command: click.Command = cli, path: str = "") -> Iterator[tuple[str, click.Command]]:
    """(path, command) of `command` and of everything under it, groups
    included ("" is `iotune` itself, sub-commands as "volumes build")."""
    yield path, command
    if isinstance(command, click.Group):
        ctx = click.Context(command)
        for name in command.list_commands(ctx):
            sub = command.get_command(ctx, name)
            assert sub is not None, name
            yield from every_command(sub, f"{path} {name}".strip())


def keyword_catchall(command: click.Command) -> str | None:
    """The name of the `**kwargs` parameter of the function under
    `command`'s callback (functools.wraps layers unwrapped: option_group's
    and library_errors' wrappers take **kwargs themselves), or None."""
    if command.callback is None:
        return None
    function = inspect.unwrap(command.callback)
    return next((p.name for p in inspect.signature(function).parameters.values()
                 if p.kind is inspect.Parameter.VAR_KEYWORD), None)


def cases() -> list[Any]:
    return [pytest.param(command, id=path or "iotune") for path, command in every_command()]


@pytest.mark.parametrize("command", cases())
def test_no_command_takes_keyword_catchall(command: click.Command) -> None:
    assert keyword_catchall(command) is None, (
        f"{command.name} takes **{keyword_catchall(command)}: give its options as typed option groups "
        f"(options.option_group, as `iotune trace` does)")


def test_the_walk_reaches_groups_and_their_sub_commands() -> None:
    paths = {path for path, _ in every_command()}
    assert {"", "trace", "plan", "lint", "volumes", "volumes build", "sweep", "sweep aio", "sweep offload",
            "sweep checkpoint", "sweep layouts", "sweep netfs"} <= paths


@dataclass(frozen=True)
class _Size:
    size: int


def test_the_check_sees_through_option_groups_and_finds_a_catchall() -> None:
    @click.command()
    @option_group(_Size, "size", click.option("--size", type=int, default=1))
    def typed(size: _Size) -> None: ...

    @click.command()
    @option_group(_Size, "size", click.option("--size", type=int, default=1))
    @click.option("--other", default=None)
    def untyped(size: _Size, **opts: Any) -> None: ...

    wrapper = inspect.signature(typed.callback, follow_wrapped=False)    # what click calls takes **kwargs itself
    assert [p.kind for p in wrapper.parameters.values()] == [inspect.Parameter.VAR_POSITIONAL,
                                                             inspect.Parameter.VAR_KEYWORD]
    assert keyword_catchall(typed) is None
    assert keyword_catchall(untyped) == "opts"
