"""`iotune trace --slurm`: inside a Slurm allocation, an agent on every node
of the job through `srun --overlap`, the command run here, each node's run
gathered into one multi-node run. On a real Slurm cluster on this machine
(tests/slurmbed.py: munged, slurmctld, one slurmd per node of the node bed,
each in its node's mount namespace) a batch job's srun step writes a known
number of 512 KiB direct writes on every node, chosen by the node's
SLURMD_NODENAME, and each node must be counted exactly, under its Slurm
name; a node whose agent is killed mid-run is lost and the others kept;
iotune missing on the nodes and --slurm outside an allocation are clear
errors."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from iotune.remote.slurm import SrunTransport, expand_hostlist
from iotune.cli import cli
from iotune.remote.hosts import deepspeed_option
from iotune.model.fleet import load_fleet
from iotune.trace.attribution import INJECT_DIR
from iotune.host.undo import namespace_pids
from tests.beds.slurm import SlurmBed
from tests.nodebed import BLOCK, nodebed, writes_512k  # noqa: F401
from tests.slurmbed import needs_slurmbed, slurmbed  # noqa: F401

ROOT = Path(__file__).resolve().parents[2]
COUNTS = {"n2": 23, "n3": 29, "n4": 31}     # 512 KiB O_DIRECT writes per Slurm node


def node_writes(shared: Path, wait_for: Path | None = None) -> str:
    """The job's step: each node writes its count (by SLURMD_NODENAME) of
    512 KiB direct writes to its own drive; optionally then waits for a file."""
    cases = " ".join(f"{name}) c={count};;" for name, count in COUNTS.items())
    f = f"{shared}/f-$SLURM_PROCID"
    wait = f" && while [ ! -e {wait_for} ]; do sleep 0.05; done" if wait_for else ""
    return (f"case $SLURMD_NODENAME in {cases} *) exit 9;; esac; "
            f"dd if=/dev/zero of={f} bs=512K count=$c oflag=direct status=none && rm {f}{wait}")


def trace_argv(bed: SlurmBed, remote: Path, out: Path, step: str) -> list[str]:
    return [sys.executable, "-m", "iotune", "trace", "--slurm", "--path", str(bed.shared_path),
            "--remote-iotune", str(remote), "-o", str(out), "--",
            "srun", "--ntasks-per-node=1", "sh", "-c", step]


def slurm_env(bed: SlurmBed) -> dict[str, str]:
    return {**os.environ, **bed.env(), "PYTHONPATH": str(ROOT)}


@needs_slurmbed
def test_a_batch_jobs_nodes_are_traced_through_srun_with_exactly_their_own_writes(
        slurmbed: SlurmBed, remote_iotune: Path, tmp_path: Path) -> None:  # noqa: F811
    bed = slurmbed
    step = node_writes(bed.shared_path)
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/sh\n" + shlex.join(trace_argv(bed, remote_iotune, tmp_path / "fleet", step)) + "\n")
    job = subprocess.run(["sbatch", "--wait", "--parsable", f"--nodes={len(bed.nodes)}",
                          f"--output={tmp_path}/job.out", f"--error={tmp_path}/job.err", str(script)],
                         env=slurm_env(bed), capture_output=True, text=True, timeout=240, check=False)
    err = (tmp_path / "job.err").read_text()
    assert job.returncode == 0, (job.stderr, err)
    job_id = job.stdout.strip()
    fleet = load_fleet(tmp_path / "fleet")
    assert fleet.transport == "srun" and fleet.command[:2] == ("srun", "--ntasks-per-node=1")
    assert [(n.host, n.status, n.error) for n in fleet.nodes] == [(name, "ok", "") for name in bed.names]
    for node in bed.nodes:
        assert writes_512k(fleet, node.name) == COUNTS[node.name]
        run = fleet.node(node.name).run  # type: ignore[union-attr]
        assert run is not None and [d.name for d in run.devices] == [node.bed_node.drive.device.name]
        assert (run.outcome, run.exit_status) == ("completed", 0)
    assert f"tracing the 3 node(s) of Slurm job {job_id} via srun: n2, n3, n4\n" in err
    assert "3 node(s), 3 ok · via srun" in (tmp_path / "job.out").read_text()
    assert "Traceback" not in err


def agent_pid(bed: SlurmBed, index: int) -> int | None:
    for pid in namespace_pids(bed.nodes[index].bed_node.mount_ns):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"iotune" in argv and b"agent" in argv:
            return pid
    return None


def srun_client_of(node: str) -> int | None:
    """The `srun ... --nodelist=NODE ... iotune agent` step iotune started for `node`."""
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            argv = cmdline.read_bytes().split(b"\0")
        except OSError:
            continue
        if argv[:1] == [b"srun"] and f"--nodelist={node}".encode() in argv and b"agent" in argv:
            return int(cmdline.parent.name)
    return None


@needs_slurmbed
def test_a_node_whose_agent_is_killed_mid_run_is_lost_and_the_others_kept(
        slurmbed: SlurmBed, remote_iotune: Path, tmp_path: Path) -> None:  # noqa: F811
    bed = slurmbed
    go, started = tmp_path / "go", tmp_path / "started"
    step = f"touch {started}-$SLURMD_NODENAME && {node_writes(bed.shared_path, go)}"
    proc = subprocess.Popen(["salloc", f"--nodes={len(bed.nodes)}", "--quiet",
                             *trace_argv(bed, remote_iotune, tmp_path / "fleet", step)],
                            env=slurm_env(bed), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 180
        while not all(Path(f"{started}-{name}").exists() for name in bed.names):   # agents trace, step runs
            assert time.monotonic() < deadline and proc.poll() is None, proc.communicate()
            time.sleep(0.05)
        pid, client = agent_pid(bed, 2), srun_client_of(bed.names[2])
        assert pid is not None and client is not None
        os.kill(pid, signal.SIGKILL)             # n4's agent, by its pid
        deadline = time.monotonic() + 30
        while srun_client_of(bed.names[2]) == client:       # its srun step has ended (not a fixed sleep)
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
    assert err.splitlines()[-1] == ("Error: 1 of 3 node(s) not traced to the end (n4 lost: see the report); the "
                                    f"other nodes' runs are kept in {tmp_path / 'fleet'}")
    fleet = load_fleet(tmp_path / "fleet")
    assert [(n.host, n.status) for n in fleet.nodes] == [("n2", "ok"), ("n3", "ok"), ("n4", "lost")]
    lost = fleet.nodes[2]
    assert lost.run is None and lost.error.startswith("host n4: the agent exited (status ")
    assert "host n4: the agent exited" in err and "its node will be reported lost" in err
    assert writes_512k(fleet, "n2") == COUNTS["n2"]
    assert writes_512k(fleet, "n3") == COUNTS["n3"]
    assert "3 node(s), 2 ok · via srun" in out


@needs_slurmbed
def test_nodes_without_iotune_are_a_clear_error(slurmbed: SlurmBed, tmp_path: Path) -> None:  # noqa: F811
    bed = slurmbed
    missing = tmp_path / "venv" / "bin" / "iotune"
    ran = tmp_path / "ran"
    argv = trace_argv(bed, missing, tmp_path / "fleet", f"touch {ran}")
    proc = subprocess.run(["salloc", "--nodes=2", "--quiet", *argv], env=slurm_env(bed), capture_output=True,
                          text=True, timeout=120, check=False)
    assert proc.returncode == 1
    lines = proc.stderr.splitlines()
    assert lines[0].startswith("tracing the 2 node(s) of Slurm job ") and lines[0].endswith(" via srun: n2, n3")
    assert lines[1:] == [
        "Error: the trace agent could not start on 2 of 2 hosts (the command was not run):",
        *(f"  node {name}: iotune not found at {missing} (slurmstepd-{name}: error: execve(): {missing}: "
          f"No such file or directory): install iotune at the same path on every node of the allocation, "
          f"or pass --remote-iotune PATH" for name in ("n2", "n3"))]
    assert not ran.exists() and not (tmp_path / "fleet").exists()


# ---- without the bed ---------------------------------------------------------

def invoke(*args: str, **env: str | None):  # type: ignore[no-untyped-def]
    return CliRunner().invoke(cli, list(args), env=env)


def test_slurm_outside_an_allocation_names_the_fix() -> None:
    r = invoke("trace", "--slurm", "--path", "/", "--", "srun", "true", SLURM_JOB_ID=None, SLURM_JOBID=None)
    assert r.exit_code == 2
    assert r.stderr == ("Error: --slurm traces every node of the Slurm allocation it runs in, and SLURM_JOB_ID is "
                        "not set: run it inside one (in an sbatch script, or `salloc -N NODES iotune trace --slurm "
                        "...`), or name the nodes with --hosts/--hostfile (ssh)\n")


def test_slurm_without_srun_names_the_fix(tmp_path: Path) -> None:
    r = invoke("trace", "--slurm", "--path", "/", "--", "true", SLURM_JOB_ID="7", PATH=str(tmp_path))
    assert r.exit_code == 1
    assert r.stderr == ("Error: srun not found on PATH inside Slurm job 7: --slurm runs the agents with srun; install "
                        "Slurm's client commands (Debian: slurm-client) on the nodes or put them on PATH, or use "
                        "--hosts/--hostfile (ssh)\n")


def test_deepspeeds_slurm_launcher_implies_slurm() -> None:
    r = invoke("trace", "--path", "/", "--", "deepspeed", "--launcher=slurm", "--hostfile", "hf", "train.py",
               SLURM_JOB_ID=None, SLURM_JOBID=None)
    assert r.exit_code == 2
    assert r.stderr.startswith("tracing every node of the Slurm allocation (DeepSpeed's --launcher slurm): as with "
                               "--slurm\nError: --slurm traces every node of the Slurm allocation it runs in, and ")
    assert deepspeed_option(["deepspeed", "--launcher", "slurm", "t.py"], ("--launcher",)) == "slurm"
    assert deepspeed_option(["deepspeed", "t.py", "--launcher", "slurm"], ("--launcher",)) is None   # the script's


def test_slurm_and_hosts_together() -> None:
    r = invoke("trace", "--slurm", "--hosts", "a,b", "--path", "/", "--", "true")
    assert r.exit_code == 2
    assert r.stderr == ("Error: give --slurm or --hosts/--hostfile, not both: --slurm traces every node of the Slurm "
                        "allocation\n")


def test_a_single_node_trace_in_a_multi_node_allocation_says_how_to_trace_every_node() -> None:
    r = invoke("trace", "--remote-iotune", "/x/iotune", "--", "true", SLURM_JOB_ID="7", SLURM_JOB_NUM_NODES="3")
    assert r.exit_code == 2
    assert r.stderr == ("inside Slurm job 7 of 3 nodes, tracing this node only: add --slurm (and --path) to trace "
                        "every node\n"
                        "Error: --remote-iotune is for a multi-node trace: add --hosts, --hostfile or --slurm, or drop "
                        "--remote-iotune\n")


def test_srun_transport() -> None:
    t = SrunTransport("42")
    assert t.argv("n3", ["/v/bin/iotune", "agent", "--path", "/mnt/x"]) == [
        "srun", "--jobid=42", "--overlap", "--nodes=1", "--ntasks=1", "--ntasks-per-node=1", "--kill-on-bad-exit=0",
        "--nodelist=n3", "--job-name=iotune-agent", "--", "/v/bin/iotune", "agent", "--path", "/mnt/x"]
    stderr = ("slurmstepd-n3: error: execve(): /v/bin/iotune: No such file or directory\n"
              "srun: error: n3: task 0: Exited with exit code 2\n")
    assert t.last_message(stderr) == "slurmstepd-n3: error: execve(): /v/bin/iotune: No such file or directory"
    assert t.node_check("n3", "n3") == ""
    assert t.node_check("n3", "n2") == "node n3: srun ran the agent on n2, not on n3; its run is not this node's"


@needs_slurmbed
def test_a_nodelist_is_expanded_by_slurm(slurmbed: SlurmBed, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    monkeypatch.setenv("SLURM_CONF", str(slurmbed.conf))      # scontrol reads the cluster's configuration
    assert expand_hostlist("n[2-4],gpu[07-08],login") == ("n2", "n3", "n4", "gpu07", "gpu08", "login")


def test_the_hook_takes_the_rank_from_slurm_when_no_launcher_set_rank(tmp_path: Path) -> None:
    """A task started by srun (DeepSpeed's --launcher slurm) has SLURM_PROCID before the script sets RANK."""
    code = "import _iotune_hooks as h; h._out(); h._flush()"
    for env, rank in (({"SLURM_PROCID": "5"}, 5), ({"SLURM_PROCID": "5", "RANK": "3"}, 3), ({}, 0)):
        events = tmp_path / f"events-{rank}"
        events.mkdir()
        clean = {k: v for k, v in os.environ.items() if k not in ("RANK", "SLURM_PROCID")}
        subprocess.run([sys.executable, "-c", code], check=True,
                       env={**clean, **env, "PYTHONPATH": str(INJECT_DIR), "IOTUNE_EVENTS_DIR": str(events)})
        [f] = events.glob("events-*.jsonl")
        assert json.loads(f.read_text().splitlines()[0])["rank"] == rank


@needs_slurmbed
def test_a_slurm_sweep_runs_on_every_node_and_flags_the_low_capped_one(
        slurmbed: SlurmBed, remote_iotune: Path, tmp_path: Path) -> None:  # noqa: F811
    """`iotune sweep --slurm` in an allocation: the same sweep on every node
    through srun steps, each node's outcome saved, n4 (15 MB/s) flagged."""
    from tests.sweep.test_fleet_sweep import PROFILE

    bed = slurmbed
    (tmp_path / "tiny.toml").write_text(PROFILE)
    argv = [sys.executable, "-m", "iotune", "sweep", "--slurm", "--path", str(bed.shared_path), "--profile",
            str(tmp_path / "tiny.toml"), "--remote-iotune", str(remote_iotune), "-o", str(tmp_path / "fleet"),
            "--json"]
    proc = subprocess.run(["salloc", f"--nodes={len(bed.nodes)}", "--quiet", *argv], env=slurm_env(bed),
                          capture_output=True, text=True, timeout=240, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads(proc.stdout)
    assert [(n["host"], n["status"]) for n in doc["nodes"]] == [(name, "ok") for name in bed.names]
    assert doc["slow"] == ["n4"] and "host n4 is slow: measured ceiling" in doc["summary"]
    for name in bed.names:
        node_doc = json.loads((tmp_path / "fleet" / "nodes" / name / "sweep.json").read_text())
        assert node_doc["target"] == str(bed.shared_path) and len(node_doc["ranking"]) >= 2
    assert "sweeping the 3 node(s) of Slurm job " in proc.stderr and "via srun: n2, n3, n4" in proc.stderr
    assert "n4: [" in proc.stderr                          # the nodes' progress lines, with their name
    assert "this node only" not in proc.stderr and "Traceback" not in proc.stderr
