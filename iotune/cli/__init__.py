"""The `iotune` command line: each command parses its options, calls the
library, renders the result and maps IotuneError to an exit code. Nothing
else in iotune imports this package."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

import click

from .. import __version__
from . import demo, doctor, fleet, lint, plan, schema, signals, sweep, trace, volumes


def package_version() -> str:
    """The installed distribution's version (importlib.metadata); iotune's
    own __version__ when run from a source tree that is not installed."""
    try:
        return version("iotune")
    except PackageNotFoundError:
        return __version__


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_version(), "--version", prog_name="iotune",
                      message="%(prog)s %(version)s")
def cli() -> None:
    """Profile and tune storage I/O for LLM training that offloads to NVMe.

    \b
    Start with:
      sudo iotune doctor                       check prerequisites
      sudo iotune demo                         trace the built-in offload workload
      sudo iotune trace -- deepspeed train.py  trace your own job
      iotune report iotune-runs/<run>          show a saved run again
      sudo iotune sweep --path /mnt/nvme/swap  tune DeepSpeed's aio settings for a drive
    """


for command in (trace.trace, trace.report, trace.compare, sweep.sweep, lint.lint, plan.plan, volumes.volumes,
                doctor.doctor, demo.demo, schema.schema, fleet.agent):
    cli.add_command(command)


def main() -> None:
    signals.install()
    try:
        cli(prog_name="iotune")
    finally:
        signals.settle()
