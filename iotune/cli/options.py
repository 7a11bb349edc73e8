"""What every command shares: error mapping, parameter types, the output
options (--format/--json, --out) and printing a record through the render
registry. Written once; each command module only parses, calls, renders and
maps errors."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import shutil
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import click
from click.core import ParameterSource

from ..errors import IotuneError, UsageError
from ..model.units import parse_count, parse_duration, parse_rate, parse_size
from ..render.base import RenderOptions

F = TypeVar("F", bound=Callable[..., Any])


class CliError(click.ClickException):
    def __init__(self, message: str, exit_code: int = 1) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def library_errors(fn: F) -> F:
    """Turn library exceptions into clean messages and exit codes."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except IotuneError as e:
            raise CliError(str(e), e.exit_code) from None

    return wrapper  # type: ignore[return-value]


def option_group(cls: type[Any], name: str, *options: Callable[[F], F]) -> Callable[[F], F]:
    """`options` (click option decorators, top to bottom as they are shown
    in --help) handed to the command as one frozen dataclass `cls` under
    parameter `name`: each field of `cls` is one option's parameter name.
    click sees the options themselves, so --help and the reference list
    every one of them."""
    names = [f.name for f in dataclasses.fields(cls)]

    def decorate(fn: F) -> F:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            kwargs[name] = cls(**{n: kwargs.pop(n) for n in names})
            return fn(*args, **kwargs)

        decorated: Any = wrapper
        for option in reversed(options):
            decorated = option(decorated)
        return decorated  # type: ignore[no-any-return]

    return decorate


class ParsedType(click.ParamType):
    """A value typed the way iotune parses it (`parse`: a ValueError's message
    becomes click's error); a number given directly (a default) is taken as
    it is, through `number`. With `positive` (an example), 0 is refused."""

    def __init__(self, name: str, parse: Callable[[str], Any], number: Callable[[Any], Any],
                 positive: str = "") -> None:
        self.name, self.parse, self.number, self.positive = name, parse, number, positive

    def convert(self, value: Any, param: Any, ctx: Any) -> Any:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return self.number(value)
        try:
            parsed = self.parse(str(value))
        except ValueError as e:
            self.fail(str(e), param, ctx)
        if self.positive and parsed <= 0:
            self.fail(f"{value!r}: give a {self.name.lower()} above 0, e.g. {self.positive}", param, ctx)
        return parsed


class SettingType(click.ParamType):
    """One sweep setting, parsed and checked against its bound in
    iotune.sweep.bounds: the same record a profile's value is checked with."""

    def __init__(self, key: str) -> None:
        from ..sweep.bounds import BOUNDS

        self.bound = BOUNDS[key]
        self.name = self.bound.kind.upper()

    def convert(self, value: Any, param: Any, ctx: Any) -> Any:
        try:
            return self.bound.parse(value) if isinstance(value, str) else self.bound.check(value)
        except ValueError as e:
            self.fail(f"{value}: {e}", param, ctx)


def setting_list(key: str) -> Callable[[Any, Any, str | None], tuple[Any, ...] | None]:
    """A click callback for a comma-separated list of sweep setting `key`'s values."""
    from ..sweep.bounds import BOUNDS

    return csv_list(BOUNDS[key].parse)


def setting_help(key: str, text: str) -> str:
    """`text` and the setting's bounds, as click shows a range."""
    from ..sweep.bounds import BOUNDS

    bound = BOUNDS[key]
    each = "each " if bound.section == "space" else ""
    return f"{text}  [{each}{bound.short_rule()}]"


SIZE = ParsedType("SIZE", parse_size, int)                  # 512K and 1M binary (KiB, MiB), 200MB decimal
POSITIVE_SIZE = ParsedType("SIZE", parse_size, int, positive="600TB")   # a drive's capacity or endurance
RATE = ParsedType("RATE", parse_rate, float)                # bytes/s: 200MB/s decimal, 2GiB/s binary; /s optional
COUNT = ParsedType("N", parse_count, int)                   # a parameter count: 16B, 1.5B, 350M, 7e9
DURATION = ParsedType("DURATION", parse_duration, float)   # seconds: 45m, 2h, 1h30m, 90s


def csv_list(convert: Callable[[str], Any]) -> Callable[[Any, Any, str | None], tuple[Any, ...] | None]:
    """A click callback for comma-separated values, each through `convert`."""
    def parse(ctx: Any, param: Any, value: str | None) -> tuple[Any, ...] | None:
        if not value:
            return None
        items = [v.strip() for v in value.split(",") if v.strip()]
        if not items:
            raise click.BadParameter(f"{value!r}: give one value or more, separated by commas")
        converted = []
        for item in items:
            try:
                converted.append(convert(item))
            except ValueError as e:
                raise click.BadParameter(f"{item!r}: {e}") from None
        return tuple(converted)
    return parse


def json_option(fn: F) -> F:
    """--json alone, for commands whose only other output is plain text
    (`iotune volumes`, `iotune schema`)."""
    return click.option("--json", "as_json", is_flag=True,
                        help="The result as one JSON document on stdout, nothing else there.")(fn)


def format_option(fn: F) -> F:
    """--format console|json, and --json as its shorthand."""
    fn = click.option("--json", "as_json", is_flag=True,
                      help="Same as --format json: the result as JSON on stdout, nothing else there.")(fn)
    fn = click.option("--format", "fmt", type=click.Choice(["console", "json"]), default="console",
                      show_default=True, help="Output format on stdout (progress and status go to stderr).")(fn)
    return fn


def out_option(help: str) -> Callable[[F], F]:
    """-o/--out DIR: where a command saves what it writes (-o means --out in every command)."""
    return click.option("-o", "--out", type=click.Path(file_okay=False, path_type=Path), default=None,
                        metavar="DIR", help=help)


def given(name: str) -> bool:
    """Whether the current command's parameter `name` was set by the user
    (command line or environment), not left at its default."""
    source = click.get_current_context().get_parameter_source(name)
    return source in (ParameterSource.COMMANDLINE, ParameterSource.ENVIRONMENT)


def renamed_option(old: str, new: str, dest: str, **attrs: Any) -> Callable[[F], F]:
    """`old`, the spelling `new` had until this release, as a hidden option
    setting the same value (parameter `dest`); using it says so on stderr.
    Kept for one release, then removed."""
    alias_dest = "renamed_" + old.lstrip("-").replace("-", "_")

    def decorate(fn: F) -> F:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            value = kwargs.pop(alias_dest, None)
            if value is not None:
                if given(dest):
                    raise UsageError(f"{old} is the old spelling of {new}: give {new} only")
                say(f"warning: {old} is deprecated and will be removed in the next release: use {new}")
                kwargs[dest] = value
                click.get_current_context().set_parameter_source(dest, ParameterSource.COMMANDLINE)
            return fn(*args, **kwargs)

        option = click.option(old, alias_dest, hidden=True, default=None, **attrs)
        return option(library_errors(wrapper))  # type: ignore[return-value]

    return decorate


def report_options(fn: F) -> F:
    """--block-size and --width: options of commands that print a trace report."""
    fn = click.option("--block-size", type=SIZE, default=None, metavar="SIZE",
                      help="Block size for the I/O-pattern table, e.g. 512K (the DeepSpeed aio "
                           "block_size). Default: each device's dominant request size.")(fn)
    fn = click.option("--width", type=click.IntRange(60, 400), default=None,
                      help="Report width in columns (default: the terminal's, at least 120).")(fn)
    return fn


def refuse_width_with_json(fmt: str) -> None:
    """--width shapes the console report only."""
    if fmt == "json" and given("width"):
        raise UsageError("--width sets the console report's width, and --json prints no console report: "
                         "drop --width")


def html_option(fn: F) -> F:
    """--html FILE: also write the report as one self-contained HTML file."""
    return click.option("--html", "html_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
                        metavar="FILE", help="Also write the report to FILE as one self-contained HTML page "
                                             "with interactive charts (opens offline, nothing fetched).")(fn)


def write_html(record: Any, path: Path | None) -> None:
    """`record`'s HTML report into `path` (nothing when None); says where on stderr."""
    if path is None:
        return
    from ..render.registry import render

    try:
        path.write_text(render(record, "html"), encoding="utf-8")
    except OSError as e:
        raise UsageError(f"cannot write the HTML report to {path}: {e.strerror}; choose another --html FILE") from None
    say(f"HTML report: {path}")


def chosen_format(fmt: str, as_json: bool) -> str:
    return "json" if as_json else fmt


@dataclass(frozen=True)
class ReportOutput:
    """How a command prints a trace report: --format/--json, --width,
    --block-size and --html."""

    fmt: str
    as_json: bool
    width: int | None
    block_size: int | None
    html_path: Path | None

    @property
    def format(self) -> str:
        return chosen_format(self.fmt, self.as_json)


def report_output(fn: F) -> F:
    """--format/--json, --width, --block-size and --html as one ReportOutput (`output`)."""
    return option_group(ReportOutput, "output", format_option, report_options, html_option)(fn)


def emit(record: Any, fmt: str, width: int | None = None, block_size: int | None = None) -> None:
    """Print `record` on stdout through its registered renderer."""
    from ..render.registry import render

    opts = RenderOptions(width=width or (max(120, shutil.get_terminal_size().columns) if fmt == "console" else None),
                         color=sys.stdout.isatty(), block_size_bytes=block_size)
    click.echo(render(record, fmt, opts), nl=False)


def say(message: str) -> None:
    """Status for the user, on stderr."""
    click.echo(message, err=True)


@contextlib.contextmanager
def resumable(note: str = "every finished trial is in the journal; run the same command again to resume"
              ) -> Iterator[None]:
    """Ctrl-C (or SIGTERM, which takes its path) ends a sweep with 130, in
    this one place; `note` says where its finished trials are and how to
    resume."""
    try:
        yield
    except KeyboardInterrupt:
        say(f"interrupted: {note}")
        sys.exit(130)


def wait_for_ctrl_c(message: str) -> None:
    """Block until Ctrl-C or SIGTERM (for commands that keep something up)."""
    import signal
    import threading

    stop = threading.Event()
    old = signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        say(message)          # inside: a Ctrl-C as soon as the message shows is caught too
        stop.wait()
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGTERM, old)
    say("tearing down")


# Option groups shared by several commands: one spelling, one meaning, one rule each.

DRIVE_CAP_DEFAULT = "200MB/s"


def drive_cap_option(note: str = "", was_cap: bool = True) -> Callable[[F], F]:
    """--drive-cap RATE: the bandwidth cap of each scratch drive iotune
    makes (cgroup blkio, each direction), 0 for none, one default. Where it
    was spelled `--cap` (`demo`, `volumes scratch`: `was_cap`), that
    spelling is kept hidden for one release."""
    def decorate(fn: F) -> F:
        if was_cap:
            fn = renamed_option("--cap", "--drive-cap", "drive_cap", type=RATE, metavar="RATE")(fn)
        return click.option("--drive-cap", "drive_cap", type=RATE, default=DRIVE_CAP_DEFAULT, show_default=True,
                            metavar="RATE",
                            help=f"{note}{'b' if note else 'B'}andwidth cap of each scratch drive, each direction "
                                 f"(cgroup blkio), e.g. 100MB/s or 1GB/s (decimal); 0 for none.")(fn)
    return decorate


def model_size_options(note: str = "") -> Callable[[F], F]:
    """--model PRESET / --params N: the model's size, as a preset shape or a
    parameter count; give at most one (see model_size)."""
    def decorate(fn: F) -> F:
        fn = click.option("--params", type=COUNT, default=None, metavar="N",
                          help=f"{note}Or the model's parameter count, e.g. 16B, 1.5B, 350M or 7e9 "
                               f"(not with --model).")(fn)
        return click.option("--model", "model_preset", default=None, metavar="PRESET",
                            help=f"{note}The model's shape: tiny, small, medium, wide, 1b, 3b, 8b or 16b "
                                 f"(not with --params).")(fn)
    return decorate


def model_size(preset: str | None, params: int | None, required: bool) -> tuple[Any, int | None]:
    """(ModelShape or None, parameter count or None) from --model/--params:
    one of them, or none when not `required`."""
    from ..workloads.presets import get_preset

    # iotune's UsageError, not click's: lint --json reports it in its JSON document
    if preset is not None and params is not None:
        raise UsageError("give the model as --model PRESET or --params N, not both")
    if preset is None and params is None:
        if required:
            raise UsageError("give the model as --model PRESET or --params N (one of them)")
        return None, None
    if preset is None:
        return None, params
    shape = get_preset(preset)
    return shape, shape.param_count()


def multinode_options(verb: str, detail: str) -> Callable[[F], F]:
    """--hosts, --hostfile, --slurm and --remote-iotune: `verb` (e.g.
    "trace") on several nodes at once. --slurm excludes --hosts and
    --hostfile, --hosts excludes --hostfile (fleet.fleet_nodes), and
    --remote-iotune needs one of them (refuse_remote_iotune)."""
    def decorate(fn: F) -> F:
        fn = click.option("--remote-iotune", default=None, metavar="PATH",
                          help="Multi-node: iotune's path on the hosts (default: the same path as here).")(fn)
        fn = click.option("--slurm", is_flag=True,
                          help=f"Multi-node inside a Slurm allocation (sbatch, salloc): {verb} every node of the "
                               f"job at once, through `srun --overlap` steps instead of ssh.")(fn)
        fn = click.option("--hostfile", type=click.Path(path_type=Path, dir_okay=False), default=None,
                          metavar="FILE",
                          help=f"Multi-node: {verb} every host of this DeepSpeed hostfile (`host slots=N` lines), "
                               f"as with --hosts.")(fn)
        return click.option("--hosts", default=None, metavar="H1,H2,...",
                            help=f"Multi-node: {verb} these hosts at once, over ssh ({detail}).")(fn)
    return decorate


@dataclass(frozen=True)
class MultiNodeOptions:
    """--hosts, --hostfile, --slurm and --remote-iotune (multinode_options)."""

    hosts: str | None
    hostfile: Path | None
    slurm: bool
    remote_iotune: str | None


def multinode_group(verb: str, detail: str) -> Callable[[F], F]:
    """multinode_options as one MultiNodeOptions (`nodes`)."""
    return option_group(MultiNodeOptions, "nodes", multinode_options(verb, detail))


def refuse_remote_iotune(remote_iotune: str | None, multinode: bool, command: str) -> None:

    if remote_iotune and not multinode:
        raise UsageError(f"--remote-iotune is for a multi-node {command}: add --hosts, --hostfile or "
                         f"--slurm, or drop --remote-iotune")


def endurance_options(tbw_default: str, capacity_default: str) -> Callable[[F], F]:
    """--drive-tbw and --drive-capacity: a drive's rated endurance and its
    size, for the days until the rating is reached and drive writes per
    day. Each command says what it assumes without them."""
    def decorate(fn: F) -> F:
        fn = click.option("--drive-capacity", type=POSITIVE_SIZE, default=None, metavar="SIZE",
                          help=f"One drive's capacity, e.g. 3.84TB, for drive writes per day (default: "
                               f"{capacity_default}).")(fn)
        return click.option("--drive-tbw", type=POSITIVE_SIZE, default=None, metavar="SIZE",
                            help=f"One drive's rated endurance (total bytes written), e.g. 600TB, for the days "
                                 f"until it is reached (default: {tbw_default}).")(fn)
    return decorate


# Commands with several modes: --help lists the options in sections, one per
# group (what `iotune sweep` takes in each of its modes).

class GroupedCommand(click.Command):
    """A command whose --help lists its options under the groups
    `groups` names (parameter name -> section), in the order the sections
    first appear; an option not named there goes under "Options".
    Arguments are left to click, as click.Command leaves them (click 8.5
    gives every argument a help record)."""

    def __init__(self, *args: Any, groups: dict[str, str] | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.groups = dict(groups or {})

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        sections: dict[str, list[tuple[str, str]]] = {}
        for param in self.get_params(ctx):
            record = param.get_help_record(ctx)
            if record is not None and not isinstance(param, click.Argument):
                sections.setdefault(self.groups.get(param.name or "", "Options"), []).append(record)
        order = list(dict.fromkeys([*self.groups.values(), "Options"]))
        for name in sorted(sections, key=lambda n: order.index(n) if n in order else len(order)):
            with formatter.section(name):
                formatter.write_dl(sections[name])
