"""What every command shares: error mapping, parameter types, the output
options (--format/--json, --out) and printing a record through the render
registry. Written once; each command module only parses, calls, renders and
maps errors."""

from __future__ import annotations

import functools
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from ..errors import IotuneError
from ..model.units import parse_rate, parse_size
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


class SizeType(click.ParamType):
    """A byte count: 512K and 1M are binary (KiB, MiB), 200MB decimal."""

    name = "SIZE"

    def convert(self, value: Any, param: Any, ctx: Any) -> int:
        if isinstance(value, int):
            return value
        try:
            return parse_size(str(value))
        except ValueError as e:
            self.fail(str(e), param, ctx)


class RateType(click.ParamType):
    """Bytes per second: 200MB/s (decimal), 2GiB/s (binary); `/s` optional."""

    name = "RATE"

    def convert(self, value: Any, param: Any, ctx: Any) -> float:
        if isinstance(value, (int, float)):
            return float(value)
        try:
            return parse_rate(str(value))
        except ValueError as e:
            self.fail(str(e), param, ctx)


SIZE = SizeType()
RATE = RateType()


def csv_list(convert: Callable[[str], Any]) -> Callable[[Any, Any, str | None], tuple[Any, ...] | None]:
    """A click callback for comma-separated values, each through `convert`."""
    def parse(ctx: Any, param: Any, value: str | None) -> tuple[Any, ...] | None:
        if not value:
            return None
        try:
            return tuple(convert(v.strip()) for v in value.split(",") if v.strip())
        except ValueError as e:
            raise click.BadParameter(f"{value!r}: {e}") from None
    return parse


def positive_int(text: str) -> int:
    n = int(text)
    if n < 1:
        raise ValueError("values must be at least 1")
    return n


def bool_word(text: str) -> bool:
    if text.lower() in ("true", "yes", "1"):
        return True
    if text.lower() in ("false", "no", "0"):
        return False
    raise ValueError("use true or false")


def format_option(fn: F) -> F:
    """--format console|json, and --json as its shorthand."""
    fn = click.option("--json", "as_json", is_flag=True,
                      help="Same as --format json: the result as JSON on stdout, nothing else there.")(fn)
    fn = click.option("--format", "fmt", type=click.Choice(["console", "json"]), default="console",
                      show_default=True, help="Output format on stdout (progress and status go to stderr).")(fn)
    return fn


def out_option(help: str) -> Callable[[F], F]:
    return click.option("-o", "--out", type=click.Path(file_okay=False, path_type=Path), default=None,
                        metavar="DIR", help=help)


def report_options(fn: F) -> F:
    """--block-size and --width: options of commands that print a trace report."""
    fn = click.option("--block-size", type=SIZE, default=None, metavar="SIZE",
                      help="Block size for the I/O-pattern table, e.g. 512K (the DeepSpeed aio "
                           "block_size). Default: each device's dominant request size.")(fn)
    fn = click.option("--width", type=click.IntRange(60, 400), default=None,
                      help="Report width in columns (default: the terminal's, at least 120).")(fn)
    return fn


def html_option(fn: F) -> F:
    """--html FILE: also write the report as one self-contained HTML file."""
    return click.option("--html", "html_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
                        metavar="FILE", help="Also write the report to FILE as one self-contained HTML page "
                                             "with interactive charts (opens offline, nothing fetched).")(fn)


def write_html(record: Any, path: Path | None) -> None:
    """`record`'s HTML report into `path` (nothing when None); says where on stderr."""
    if path is None:
        return
    from ..errors import UsageError
    from ..render.registry import render

    try:
        path.write_text(render(record, "html"), encoding="utf-8")
    except OSError as e:
        raise UsageError(f"cannot write the HTML report to {path}: {e.strerror}; choose another --html FILE") from None
    say(f"HTML report: {path}")


def chosen_format(fmt: str, as_json: bool) -> str:
    return "json" if as_json else fmt


def emit(record: Any, fmt: str, width: int | None = None, block_size: int | None = None) -> None:
    """Print `record` on stdout through its registered renderer."""
    from ..render.registry import render

    opts = RenderOptions(width=width or (max(120, shutil.get_terminal_size().columns) if fmt == "console" else None),
                         color=sys.stdout.isatty(), block_size_bytes=block_size)
    click.echo(render(record, fmt, opts), nl=False)


def say(message: str) -> None:
    """Status for the user, on stderr."""
    click.echo(message, err=True)


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
