"""ssh to the nodes of a multi-node run, shared by the multi-node trace
(trace.fleet) and the multi-node sweep (sweep.fleet): the options pdsh and
DeepSpeed's launcher use, ssh's own defaults for unattended runs, and the
error text for a host that cannot be reached or lacks iotune."""

from __future__ import annotations

import shlex
from collections.abc import Sequence

SSH_DEFAULTS = ("-T", "-o", "BatchMode=yes", "-o", "ConnectTimeout=10")
SSH_FAILED = 255          # ssh's own status when it cannot connect or log in
NOT_FOUND = 127           # the remote shell's status for a missing program


def ssh_options_from_env(env: dict[str, str]) -> tuple[str, ...]:
    """The ssh options pdsh and DeepSpeed's launcher use: PDSH_SSH_ARGS_APPEND."""
    return tuple(shlex.split(env.get("PDSH_SSH_ARGS_APPEND", "")))


def ssh_argv(host: str, remote_argv: Sequence[str], ssh_options: Sequence[str]) -> list[str]:
    """The ssh command line running `remote_argv` (quoted for the remote shell) on `host`."""
    return ["ssh", *ssh_options, *SSH_DEFAULTS, host, "--", shlex.join(remote_argv)]


def host_error(host: str, code: int | None, tail: str, remote_iotune: str) -> str | None:
    """The message for a host ssh could not reach or log in to, or where
    iotune is missing, naming the host and the fix; None for any other exit."""
    if code == SSH_FAILED and ("ssh:" in tail or "Permission denied" in tail or "Could not resolve" in tail):
        return (f"host {host}: cannot reach it over ssh ({tail}): check the host name, that sshd runs there and "
                f"that `ssh {host} true` logs in without a password (ssh options: PDSH_SSH_ARGS_APPEND)")
    if code == NOT_FOUND:
        return (f"host {host}: iotune not found at {remote_iotune}: install iotune there "
                f"or pass --remote-iotune PATH")
    return None
