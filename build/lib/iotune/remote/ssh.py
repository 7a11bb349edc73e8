"""ssh to the nodes of a multi-node run, shared by the multi-node trace
(trace.fleet) and the multi-node sweep (sweep.fleet): the options pdsh and
DeepSpeed's launcher use, ssh's own defaults for unattended runs, and the
error text for a host that cannot be reached or lacks iotune.

A `Transport` is how a command reaches a node: `SshTransport` here, Slurm's
`srun` in remote.slurm. Each runs one process per node, with that node's
own stdin, binary stdout and exit status (what the trace agent's protocol
needs)."""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from ..host.proc import last_line

# ServerAlive: a connection that goes silent (a network partition, a frozen node) is given up after
# about a minute (ssh then prints "Timeout, server HOST not responding."), not waited on forever.
# The user's own options come first and win (ssh keeps the first value of an option).
SSH_DEFAULTS = ("-T", "-o", "BatchMode=yes", "-o", "ConnectTimeout=10", "-o", "ServerAliveInterval=15",
                "-o", "ServerAliveCountMax=4")
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


# what ssh prints when an established connection goes away (sshd killed, the node rebooted, a reset)
SSH_LOST = ("closed by remote host", "Connection reset", "Broken pipe", "not responding", "Connection closed")


def ssh_connection_lost(code: int | None, tail: str) -> bool:
    """Whether ssh exited because its connection dropped (not the remote command)."""
    return code == SSH_FAILED and any(s in tail for s in SSH_LOST)


class Transport(Protocol):
    """How a command reaches a node: one local process per node."""

    @property
    def name(self) -> str: ...           # recorded in the fleet: "ssh", "srun"

    def argv(self, host: str, remote_argv: Sequence[str]) -> list[str]:
        """The local command line running `remote_argv` on `host`."""
        ...

    def last_message(self, stderr: str) -> str:
        """The line of a node's stderr that says what went wrong."""
        ...

    def error(self, host: str, code: int | None, tail: str, remote_iotune: str) -> str | None:
        """The message for a node the transport could not reach, or where
        iotune is missing (naming the node and the fix); None otherwise."""
        ...

    def node_check(self, host: str, reported: str | None) -> str:
        """"" when the node an agent says it runs on (its ready line's
        scheduler node name, None when it names none) is `host`; else why not."""
        ...


@dataclass(frozen=True)
class SshTransport:
    options: tuple[str, ...] = ()        # extra ssh options (PDSH_SSH_ARGS_APPEND)

    @property
    def name(self) -> str:
        return "ssh"

    def argv(self, host: str, remote_argv: Sequence[str]) -> list[str]:
        return ssh_argv(host, remote_argv, self.options)

    def last_message(self, stderr: str) -> str:
        return last_line(stderr, "no message")

    def error(self, host: str, code: int | None, tail: str, remote_iotune: str) -> str | None:
        return host_error(host, code, tail, remote_iotune)

    def node_check(self, host: str, reported: str | None) -> str:
        return ""                        # ssh HOST is HOST (aliases and addresses cannot be compared)
