"""`iotune trace --hosts/--hostfile`: an agent per host over ssh, the
command run here, each host's run gathered into one multi-node run. On the
one-machine bed (tests/nodebed.py) every node writes a known number of
512 KiB direct writes to its own drive at the shared path and must be
counted exactly; a node whose agent is killed mid-run is lost and the others
kept; unreachable hosts and hosts without iotune are clear errors."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from iotune.cli import cli
from iotune.model.fleet import load_fleet
from iotune.trace.agent import claim_events, node_identity
from iotune.remote.hosts import deepspeed_hostfile, find_nodes, read_hostfile
from iotune.remote.ssh import SshTransport
from iotune.host.undo import namespace_pids
from tests.beds.nodes import NodeBed
from tests.nodebed import BLOCK, needs_nodebed, nodebed, writes_512k  # noqa: F401

ROOT = Path(__file__).resolve().parents[2]
COUNTS = (23, 29, 31)        # 512 KiB O_DIRECT writes on nodes 2, 3, 4


def writes_on(bed: NodeBed, host: str, count: int) -> str:
    shared = bed.shared_path
    return (f"ssh -F {bed.ssh_config} {host} 'dd if=/dev/zero of={shared}/f bs=512K count={count} oflag=direct "
            f"status=none && rm {shared}/f'")


def iotune_trace(bed: NodeBed, remote: Path, out: Path, script: str, *hosts_args: str,
                 env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    argv = [sys.executable, "-m", "iotune", "trace", *hosts_args, "--path", str(bed.shared_path),
            "--remote-iotune", str(remote), "-o", str(out), "--", "sh", "-c", script]
    env = {**os.environ, **bed.env(), "PYTHONPATH": str(ROOT), **(env or {})}
    return subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@needs_nodebed
def test_every_node_is_traced_with_exactly_its_own_writes(nodebed: NodeBed, remote_iotune: Path,  # noqa: F811
                                                          tmp_path: Path) -> None:
    bed = nodebed
    script = " && ".join(writes_on(bed, h, n) for h, n in zip(bed.hosts, COUNTS))
    proc = iotune_trace(bed, remote_iotune, tmp_path / "fleet", script, "--hosts", ",".join(bed.hosts))
    out, err = proc.communicate(timeout=240)
    assert proc.returncode == 0, err
    fleet = load_fleet(tmp_path / "fleet")
    assert fleet.transport == "ssh" and fleet.command == ("sh", "-c", script)
    assert [(n.host, n.status, n.error) for n in fleet.nodes] == [(h, "ok", "") for h in bed.hosts]
    for node, count in zip(bed.nodes, COUNTS):
        assert writes_512k(fleet, node.address) == count
        run = fleet.node(node.address).run  # type: ignore[union-attr]
        assert run is not None and [d.name for d in run.devices] == [node.drive.device.name]
        assert (run.outcome, run.exit_status) == ("completed", 0)
    assert "3 node(s), 3 ok" in out
    assert "Traceback" not in err


def agent_pid(bed: NodeBed, index: int) -> int | None:
    for pid in namespace_pids(bed.nodes[index].mount_ns):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"iotune" in argv and b"agent" in argv:
            return pid
    return None


@needs_nodebed
def test_a_node_whose_agent_is_killed_mid_run_is_lost_and_the_others_kept(
        nodebed: NodeBed, remote_iotune: Path, tmp_path: Path) -> None:  # noqa: F811
    bed = nodebed
    go, started = tmp_path / "go", tmp_path / "started"
    script = (f"touch {started} && {writes_on(bed, bed.hosts[0], COUNTS[0])} && "
              f"{writes_on(bed, bed.hosts[1], COUNTS[1])} && while [ ! -e {go} ]; do sleep 0.05; done")
    proc = iotune_trace(bed, remote_iotune, tmp_path / "fleet", script, "--hosts", ",".join(bed.hosts))
    try:
        deadline = time.monotonic() + 180
        while not started.exists():              # the agents are tracing and the command runs
            assert time.monotonic() < deadline and proc.poll() is None, proc.communicate()
            time.sleep(0.05)
        pid, client = agent_pid(bed, 2), ssh_client_of(proc, bed.hosts[2])
        assert pid is not None and client is not None
        os.kill(pid, signal.SIGKILL)             # node 4's agent, by its pid
        deadline = time.monotonic() + 30
        while not exited(client):                # its ssh has ended (not a fixed sleep)
            assert time.monotonic() < deadline
            time.sleep(0.05)
        go.touch()
        out, err = proc.communicate(timeout=120)
    finally:
        go.touch()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 1, err            # partial failure (docs/faults.md)
    assert err.splitlines()[-1] == (f"Error: 1 of 3 node(s) not traced to the end ({bed.hosts[2]} lost: see the "
                                    f"report); the other nodes' runs are kept in {tmp_path / 'fleet'}")
    fleet = load_fleet(tmp_path / "fleet")
    assert [(n.host, n.status) for n in fleet.nodes] == [(bed.hosts[0], "ok"), (bed.hosts[1], "ok"),
                                                         (bed.hosts[2], "lost")]
    lost = fleet.nodes[2]
    assert lost.run is None and lost.error.startswith(f"host {bed.hosts[2]}: the agent exited (status ")
    assert f"host {bed.hosts[2]}: the agent exited" in err and "its node will be reported lost" in err
    assert writes_512k(fleet, bed.hosts[0]) == COUNTS[0]
    assert writes_512k(fleet, bed.hosts[1]) == COUNTS[1]
    # reclaimed: no agent on any node, and nothing but its sshd listener left on node 4
    assert [agent_pid(bed, i) for i in range(3)] == [None, None, None]
    assert [cmdline(p) for p in namespace_pids(bed.nodes[2].mount_ns) if "[listener]" not in cmdline(p)] == []


@needs_nodebed
def test_a_hostfile_naming_an_unreachable_host_is_a_clear_error(nodebed: NodeBed, remote_iotune: Path,  # noqa: F811
                                                                tmp_path: Path) -> None:
    bed = nodebed
    hostfile = tmp_path / "hostfile"
    hostfile.write_text(f"{bed.hosts[0]} slots=1\n127.0.0.99 slots=1   # no sshd there\n")
    ran = tmp_path / "ran"
    proc = iotune_trace(bed, remote_iotune, tmp_path / "fleet", f"touch {ran}", "--hostfile", str(hostfile))
    _, err = proc.communicate(timeout=240)
    assert proc.returncode == 1
    assert err == ("Error: the trace agent could not start on 1 of 2 hosts (the command was not run):\n"
                   f"  host 127.0.0.99: cannot reach it over ssh (ssh: connect to host 127.0.0.99 port {bed.port}: "
                   "Connection refused): check the host name, that sshd runs there and that `ssh 127.0.0.99 true` "
                   "logs in without a password (ssh options: PDSH_SSH_ARGS_APPEND)\n")
    assert not ran.exists() and not (tmp_path / "fleet").exists()


@needs_nodebed
def test_a_host_without_iotune_is_a_clear_error(nodebed: NodeBed, tmp_path: Path) -> None:  # noqa: F811
    bed = nodebed
    missing = tmp_path / "venv" / "bin" / "iotune"
    proc = iotune_trace(bed, missing, tmp_path / "fleet", "true", "--hosts", bed.hosts[1])
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 1
    assert err == ("Error: the trace agent could not start on 1 of 1 hosts (the command was not run):\n"
                   f"  host {bed.hosts[1]}: iotune not found at {missing}: install iotune there "
                   "or pass --remote-iotune PATH\n")


# ---- without the bed ---------------------------------------------------------

def invoke(*args: str):  # type: ignore[no-untyped-def]
    return CliRunner().invoke(cli, list(args))


def test_a_multi_node_trace_needs_a_path_or_device() -> None:
    r = invoke("trace", "--hosts", "a,b", "--", "true")
    assert r.exit_code == 2
    assert r.stderr == ("Error: a multi-node trace needs --path P (each host traces the device(s) holding P there, "
                        "e.g. your nvme_path) or --device D\n")


def test_remote_iotune_without_hosts() -> None:
    r = invoke("trace", "--remote-iotune", "/x/iotune", "--", "true")
    assert r.exit_code == 2
    assert r.stderr == ("Error: --remote-iotune is for a multi-node trace: add --hosts, --hostfile or --slurm, or "
                        "drop --remote-iotune\n")


def test_hosts_listed_twice() -> None:
    r = invoke("trace", "--hosts", "a,b,a", "--path", "/", "--", "true")
    assert (r.exit_code, r.stderr) == (2, "Error: --hosts names a host twice (a,b,a): list each host once\n")


def test_hostfile_format(tmp_path: Path) -> None:
    good = tmp_path / "good"
    good.write_text("# DeepSpeed hostfile\nworker-1 slots=8\n\nworker-2 slots=8  # second\nworker-3\n")
    assert read_hostfile(good) == ("worker-1", "worker-2", "worker-3")
    bad = tmp_path / "bad"
    bad.write_text("worker-1 slots=8\nworker-2 gpus=8\n")
    r = invoke("trace", "--hostfile", str(bad), "--path", "/", "--", "true")
    assert (r.exit_code, r.stderr) == (2, f"Error: {bad} line 2: expected `HOST slots=N` (DeepSpeed's hostfile "
                                          "format), got `worker-2 gpus=8`\n")
    empty = tmp_path / "empty"
    empty.write_text("# nothing\n")
    r = invoke("trace", "--hostfile", str(empty), "--path", "/", "--", "true")
    assert (r.exit_code, r.stderr) == (2, f"Error: the hostfile {empty} names no hosts: one `HOST slots=N` "
                                          "line per node\n")


def test_deepspeed_hostfile_is_found_in_the_launcher_command() -> None:
    assert deepspeed_hostfile(["deepspeed", "--hostfile", "hf", "train.py"]) == Path("hf")
    assert deepspeed_hostfile(["/v/bin/deepspeed", "--num_gpus=1", "--hostfile=h2", "t.py"]) == Path("h2")
    assert deepspeed_hostfile(["deepspeed", "t.py", "--hostfile", "hf"]) is None    # the script's own argument
    assert deepspeed_hostfile(["python", "--hostfile", "hf"]) is None


def test_nodes_are_found_from_the_options_and_the_environment_given(tmp_path: Path) -> None:
    """Host discovery reads only what it is handed: the options, the command and an environment."""
    said: list[str] = []
    env = {"PDSH_SSH_ARGS_APPEND": "-p 2222 -o BatchMode=yes"}
    assert find_nodes("a, b", None, False, [], env, said.append) == \
        (("a", "b"), SshTransport(("-p", "2222", "-o", "BatchMode=yes")))
    hostfile = tmp_path / "hf"
    hostfile.write_text("w1 slots=1\nw2 slots=1\n")
    assert find_nodes(None, None, False, ["deepspeed", "--hostfile", str(hostfile), "t.py"], {}, said.append) == \
        (("w1", "w2"), SshTransport())
    assert said == [f"tracing every host of {hostfile} (DeepSpeed's --hostfile): w1, w2"]
    job = {"SLURM_JOB_ID": "77", "SLURM_JOB_NUM_NODES": "4"}
    assert find_nodes(None, None, False, ["python", "t.py"], job, said.append, "sweep") is None
    assert said[-1] == "inside Slurm job 77 of 4 nodes, sweeping this node only: add --slurm (and --path) to sweep " \
                       "every node"
    assert find_nodes(None, None, False, [], {**job, "SLURM_STEP_ID": "0"}, said.append) is None   # a node's own step
    assert len(said) == 2


def test_an_agent_claims_only_its_own_nodes_event_files(tmp_path: Path) -> None:
    """On the bed every node's ranks share one events directory (one /tmp):
    each agent takes the files whose process recorded its node."""
    events = tmp_path / "events"
    events.mkdir()
    here = node_identity()

    def write(pid: int, rank: int, node: str | None) -> None:
        proc = {"k": "proc", "pid": pid, "rank": rank, "argv": [], "omp": None}
        if node is not None:
            proc["node"] = node
        phase = {"k": "phase", "n": "forward", "s": 0, "t0": 1_000, "t1": 2_000}
        (events / f"events-{pid}.jsonl").write_text(json.dumps(proc) + "\n" + json.dumps(phase) + "\n")

    write(11, 0, here)
    write(12, 1, "other-host mnt:[1]")
    write(13, 2, None)                   # an older hook: no node recorded
    att = claim_events(events, here)
    assert att is not None and att.ranks == (0, 2)
    assert sorted(p.name for p in events.iterdir()) == ["events-12.jsonl"]
    assert claim_events(events, "other-host mnt:[1]").ranks == (1,)  # type: ignore[union-attr]
    assert not events.exists()           # the last agent removes the directory
    assert claim_events(events, here) is None   # an agent that comes after it: nothing, and no error


def test_an_agent_claims_nothing_from_a_directory_removed_under_its_glob(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two agents on a shared /tmp stop at once: one removes the empty
    directory between the other's look at it and its listing (a CI run's
    node was lost to this FileNotFoundError)."""
    events = tmp_path / "events"
    events.mkdir()
    real_scandir = os.scandir

    def removed_first(path: Any) -> Any:
        if isinstance(path, (str, os.PathLike)) and Path(path) == events:
            events.rmdir()
        return real_scandir(path)

    monkeypatch.setattr(os, "scandir", removed_first)
    assert claim_events(events, node_identity()) is None


def ancestors(pid: int) -> list[int]:
    """pid's parent, its parent, ... up to init."""
    out = []
    while pid > 1:
        try:
            pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except OSError:
            break
        out.append(pid)
    return out


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def exited(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] in "ZX"
    except OSError:
        return True


def ssh_client_of(proc: subprocess.Popen[str], host: str) -> int | None:
    """The `ssh HOST ... iotune agent` process iotune started for `host`."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = stat.read_text().rsplit(")", 1)[1].split()[1]
        except OSError:
            continue
        argv = cmdline(int(stat.parent.name)).split()
        if ppid == str(proc.pid) and argv[:1] == ["ssh"] and host in argv and "agent" in argv:
            return int(stat.parent.name)
    return None


@needs_nodebed
def test_a_node_whose_ssh_connection_drops_mid_run_is_lost_and_the_others_kept(
        nodebed: NodeBed, remote_iotune: Path, tmp_path: Path) -> None:  # noqa: F811
    """docs/faults.md: node 4's sshd session is killed mid-run, so its ssh
    connection drops (the agent there loses its stdin and stdout with it)."""
    bed = nodebed
    host = bed.hosts[2]
    go, started, tmp = tmp_path / "go", tmp_path / "started", tmp_path / "tmp"
    tmp.mkdir()                                  # iotune's temporary files here: none may be left
    script = (f"touch {started} && {writes_on(bed, bed.hosts[0], COUNTS[0])} && "
              f"{writes_on(bed, bed.hosts[1], COUNTS[1])} && while [ ! -e {go} ]; do sleep 0.05; done")
    proc = iotune_trace(bed, remote_iotune, tmp_path / "fleet", script, "--hosts", ",".join(bed.hosts),
                        env={"TMPDIR": str(tmp)})
    try:
        deadline = time.monotonic() + 180
        while not started.exists():              # the agents are tracing and the command runs
            assert time.monotonic() < deadline and proc.poll() is None, proc.communicate()
            time.sleep(0.05)
        agent, client = agent_pid(bed, 2), ssh_client_of(proc, host)
        assert agent is not None and client is not None
        session = next(p for p in ancestors(agent) if cmdline(p) == "sshd: root@notty")
        os.kill(session, signal.SIGKILL)         # node 4's ssh session: its connection drops
        deadline = time.monotonic() + 30
        while not exited(client):                # ssh has seen it (iotune reaps it)
            assert time.monotonic() < deadline
            time.sleep(0.05)
        go.touch()
        out, err = proc.communicate(timeout=120)
    finally:
        go.touch()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    lost_error = (f"host {host}: the ssh connection to it was lost before the command ended (Connection to {host} "
                  f"closed by remote host.)")
    fleet = _one_node_lost(proc.returncode, err, tmp_path / "fleet", bed, host, lost_error)
    assert fleet.nodes[2].run is None
    assert "3 node(s), 2 ok · via ssh" in out
    # reclaimed: no agent, session or ssh client left anywhere; no temporary file of iotune's
    assert [agent_pid(bed, i) for i in range(3)] == [None, None, None]
    assert [cmdline(p) for p in namespace_pids(bed.nodes[2].mount_ns) if "[listener]" not in cmdline(p)] == []
    assert exited(agent) and exited(session) and exited(client)
    assert os.listdir(tmp) == []


def wait_until(what: str, done: object, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not done():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"never saw {what}"
        time.sleep(0.05)


@needs_nodebed
def test_a_node_whose_ssh_connection_goes_silent_is_given_up_and_the_others_kept(
        nodebed: NodeBed, remote_iotune: Path, tmp_path: Path) -> None:  # noqa: F811
    """docs/faults.md: node 4's sshd session is frozen (SIGSTOP), as a network
    partition looks from here: nothing closes the connection. ssh's
    ServerAlive probes give it up (the test shortens them to 1 s x 2 through
    PDSH_SSH_ARGS_APPEND, whose options win over iotune's defaults)."""
    bed = nodebed
    host = bed.hosts[2]
    go, started, tmp = tmp_path / "go", tmp_path / "started", tmp_path / "tmp"
    tmp.mkdir()
    script = (f"touch {started} && {writes_on(bed, bed.hosts[0], COUNTS[0])} && "
              f"{writes_on(bed, bed.hosts[1], COUNTS[1])} && while [ ! -e {go} ]; do sleep 0.05; done")
    # LogLevel INFO, ssh's default (the bed's config says ERROR): ssh says why it gave up only at INFO
    ssh_args = (f"{bed.env()['PDSH_SSH_ARGS_APPEND']} -o ServerAliveInterval=1 -o ServerAliveCountMax=2 "
                f"-o LogLevel=INFO")
    proc = iotune_trace(bed, remote_iotune, tmp_path / "fleet", script, "--hosts", ",".join(bed.hosts),
                        env={"TMPDIR": str(tmp), "PDSH_SSH_ARGS_APPEND": ssh_args})
    session = None
    try:
        wait_until("the command running", lambda: started.exists() or proc.poll() is not None, 180)
        assert proc.poll() is None, proc.communicate()
        agent, client = agent_pid(bed, 2), ssh_client_of(proc, host)
        assert agent is not None and client is not None
        session = next(p for p in ancestors(agent) if cmdline(p) == "sshd: root@notty")
        os.kill(session, signal.SIGSTOP)         # node 4 goes silent; its connection stays open
        wait_until("ssh giving the silent node up", lambda: exited(client))
        go.touch()
        out, err = proc.communicate(timeout=120)
    finally:
        go.touch()
        if session is not None:
            os.kill(session, signal.SIGCONT)     # the node "comes back": it finds its connection closed
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    lost_error = (f"host {host}: the ssh connection to it was lost before the command ended (Timeout, server {host} "
                  f"not responding.)")
    _one_node_lost(proc.returncode, err, tmp_path / "fleet", bed, host, lost_error)
    # reclaimed here at once: the ssh client and iotune's temporary files; on the node, its agent and
    # session end as soon as it runs again (it finds its connection closed: stdin ends, stdout breaks)
    assert exited(client) and os.listdir(tmp) == []
    wait_until("the node's agent and session ending", lambda: exited(agent) and exited(session))
    assert [agent_pid(bed, i) for i in range(3)] == [None, None, None]


def test_ssh_gives_up_a_silent_connection_and_the_users_options_win() -> None:
    from iotune.remote.ssh import ssh_argv

    argv = ssh_argv("h1", ["iotune", "agent"], ("-o", "ServerAliveInterval=1"))
    assert argv[:3] == ["ssh", "-o", "ServerAliveInterval=1"]       # ssh keeps the first value given
    assert argv[3:-3] == ["-T", "-o", "BatchMode=yes", "-o", "ConnectTimeout=10", "-o", "ServerAliveInterval=15",
                          "-o", "ServerAliveCountMax=4"]
    assert argv[-3:] == ["h1", "--", "iotune agent"]


@needs_nodebed
def test_a_multi_node_run_that_does_not_fit_on_the_out_drive_is_saved_in_the_temporary_directory(
        nodebed: NodeBed, remote_iotune: Path, tmp_path: Path) -> None:  # noqa: F811
    """docs/faults.md: -o on a small ext4 filesystem that is full but for
    2 KiB: the whole multi-node run goes to $TMPDIR/iotune-runs/, nothing
    half-saved stays on the full drive."""
    from tests.conftest import ext4_mount
    from tests.cli.test_faults import fill, loops_over, mounts_under

    bed = nodebed
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    script = " && ".join(writes_on(bed, h, n) for h, n in zip(bed.hosts, COUNTS))
    with ext4_mount(tmp_path, 8 << 20) as mnt:
        out = mnt / "fleet"
        out.mkdir()
        fill(mnt, leave_bytes=2 << 10)
        proc = iotune_trace(bed, remote_iotune, out, script, "--hosts", ",".join(bed.hosts),
                            env={"TMPDIR": str(tmp)})
        stdout, err = proc.communicate(timeout=240)
        spare = tmp / "iotune-runs" / "fleet"
        assert proc.returncode == 1, err
        assert err.splitlines()[-1] == (
            f"Error: disk full: the run could not be saved to {out} (No space left on device); it was saved to "
            f"{spare} instead (iotune report {spare}): free space there and move it back with `mv {spare}/* "
            f"{out}/`, or leave it where it is")
        # kept: every node's run, exactly, where the message says; the report was shown from there
        fleet = load_fleet(spare)
        assert [(n.host, n.status) for n in fleet.nodes] == [(h, "ok") for h in bed.hosts]
        assert [writes_512k(fleet, h) for h in bed.hosts] == list(COUNTS)
        assert "3 node(s), 3 ok" in stdout
        # nothing half-saved on the full drive
        assert os.listdir(out) == []
        assert sorted(os.listdir(mnt)) == ["filler", "fleet", "lost+found"]
    assert mounts_under(tmp_path) == []
    assert loops_over(tmp_path) == []
    assert sorted(os.listdir(tmp)) == ["iotune-runs"]


def _one_node_lost(returncode: int, err: str, out: Path, bed: NodeBed, host: str, lost_error: str):
    """A trace that lost the third node: exit 1 and the messages; kept, the
    other nodes' runs exactly, and the lost node with its error, in the record."""
    assert returncode == 1, err
    assert f"{lost_error}; its node will be reported lost\n" in err
    assert err.splitlines()[-1] == (f"Error: 1 of 3 node(s) not traced to the end ({host} lost: see the report); "
                                    f"the other nodes' runs are kept in {out}")
    fleet = load_fleet(out)
    assert [(n.host, n.status, n.error) for n in fleet.nodes] == [
        (bed.hosts[0], "ok", ""), (bed.hosts[1], "ok", ""), (host, "lost", lost_error)]
    assert writes_512k(fleet, bed.hosts[0]) == COUNTS[0]
    assert writes_512k(fleet, bed.hosts[1]) == COUNTS[1]
    return fleet
