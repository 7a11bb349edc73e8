"""Errors iotune raises. Each message says what to do next; only the cli
package turns them into exit codes. This module imports nothing from iotune,
so every layer, model/ included, may raise these."""

from __future__ import annotations


class IotuneError(Exception):
    """A problem the user can fix; the message names the fix."""

    exit_code: int = 1


class UsageError(IotuneError):
    """Bad input: an option value, a device name, a path."""

    exit_code = 2


class PrivilegeError(IotuneError):
    """Not allowed to load BPF programs or touch devices."""


class ProbeError(IotuneError):
    """bcc could not compile or attach a probe."""


class CommandNotFound(IotuneError):
    """The traced command does not exist (exit 127, like a shell)."""

    exit_code = 127


class CommandNotExecutable(IotuneError):
    """The traced command exists but cannot be run (exit 126, like a shell)."""

    exit_code = 126


class RecordError(IotuneError):
    """A saved record (run, journal) cannot be read; the message says why."""

    exit_code = 2


class NoSpaceError(IotuneError):
    """A drive filled up (ENOSPC, EDQUOT) while iotune was writing a record;
    the message says what is kept, where, and how to make room."""


class WarmStartUnavailable(IotuneError):
    """The warm-start server (iotune.workloads.warmstart) could not start, or
    died; the caller runs the workload the ordinary way instead."""


class JobFailed(IotuneError):
    """A job iotune ran for the user (the demo's training run) failed; the
    message names its log, whose last lines were shown."""
