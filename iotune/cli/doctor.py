"""`iotune doctor`."""

from __future__ import annotations

import sys

import click

from .options import chosen_format, emit, format_option, library_errors, say


@click.command()
@click.option("--fix", is_flag=True, help="Apply the safe fixes (mount tracefs, link headers and bcc, apt-get install).")
@click.option("--path", "odirect_path", type=click.Path(), default=None, metavar="DIR",
              help="Also check that DIR (your nvme_path) supports O_DIRECT.")
@format_option
@library_errors
def doctor(fix: bool, odirect_path: str | None, fmt: str, as_json: bool) -> None:
    """Check every prerequisite and print the fix for each failure."""
    from ..doctor.checks import run_checks
    from ..doctor.fixes import apply_fixes
    from ..model.reports import DoctorReport

    results = run_checks(odirect_path)
    if fix:
        for line in apply_fixes(results):
            say(f"fixed: {line}")
        results = run_checks(odirect_path)
    report = DoctorReport(tuple(results))
    emit(report, chosen_format(fmt, as_json))
    if not report.ok:
        sys.exit(1)
