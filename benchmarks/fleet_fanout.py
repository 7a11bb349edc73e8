"""Issue 11's benchmark: what the multi-node fan-out of `iotune trace` costs
on the one-machine bed (tests.beds.nodes): per host, the time from the
ssh start to its agent's ready line (ssh login + probe compile and attach),
the time from the stop to its run having arrived, and the bytes sent back;
and the whole trace's wall time against the same command run untraced.

Run by hand, as root, from the repository (results go to benchmarks/results/):

    .venv/bin/python benchmarks/fleet_fanout.py --nodes 1,2,3 --rounds 3

Each round's command writes 64 x 512 KiB direct to every node's drive over
ssh, one node after the other, so every agent has something to send back.
The agents run with the defaults of `iotune trace --hosts` (attribution on,
0.01 s timeline). Untraced and traced runs alternate within a round.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from iotune.remote.ssh import SshTransport, ssh_options_from_env  # noqa: E402
from iotune.trace.fleet import FleetOptions, trace_fleet  # noqa: E402
from tests.beds.nodes import NodeBed, node_bed  # noqa: E402

MB = 1_000_000
CAP = 120 * MB
BLOCKS = 64


def workload(bed: NodeBed) -> list[str]:
    steps = [f"ssh -F {bed.ssh_config} {h} 'dd if=/dev/zero of={bed.shared_path}/f bs=512K count={BLOCKS} "
             f"oflag=direct status=none && rm {bed.shared_path}/f'" for h in bed.hosts]
    return ["sh", "-c", " && ".join(steps)]


def remote_iotune(where: Path) -> Path:
    path = where / "iotune"
    path.write_text(f'#!/bin/sh\nexec env PYTHONPATH={ROOT} {sys.executable} -m iotune "$@"\n')
    path.chmod(0o755)
    return path


def one_round(bed: NodeBed, remote: Path) -> dict[str, Any]:
    argv = workload(bed)
    env = {**os.environ, **bed.env()}
    t0 = time.perf_counter()
    subprocess.run(argv, env=env, check=True)
    untraced = time.perf_counter() - t0
    os.environ.update(bed.env())
    opts = FleetOptions(hosts=bed.hosts, agent_args=("--path", str(bed.shared_path), "--interval", "0.01"),
                        remote_iotune=str(remote),
                        transport=SshTransport(ssh_options_from_env(dict(os.environ))))
    t0 = time.perf_counter()
    outcome = trace_fleet(argv, opts, lambda msg: None)
    traced = time.perf_counter() - t0
    statuses = [n.status for n in outcome.fleet.nodes]
    if statuses != ["ok"] * len(bed.hosts) or outcome.exit_status != 0:
        raise SystemExit(f"a traced round failed: {statuses}, exit {outcome.exit_status}")
    return {"untraced_s": round(untraced, 3), "traced_s": round(traced, 3),
            "command_s": outcome.fleet.duration_s, "agents": [asdict(c) for c in outcome.costs]}


def summary(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    agents = [a for r in rounds for a in r["agents"]]

    def med(values: list[float]) -> float:
        return round(statistics.median(values), 3)

    return {"ready_s_median": med([a["ready_s"] for a in agents]),
            "ready_s_max": round(max(a["ready_s"] for a in agents), 3),
            "gather_s_median": med([a["gather_s"] for a in agents]),
            "run_bytes_median": int(statistics.median(a["run_bytes"] for a in agents)),
            "overhead_s_median": med([r["traced_s"] - r["untraced_s"] for r in rounds])}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", default="1,2,3", help="bed sizes to measure, e.g. 1,2,3")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    today = dt.date.today().isoformat()
    out = args.out or ROOT / "benchmarks" / "results" / f"fleet_fanout-{today}.json"
    doc: dict[str, Any] = {"date": today, "blocks_per_node": BLOCKS, "cap_bytes_per_s": CAP,
                           "cpus": os.cpu_count(), "beds": []}
    with tempfile.TemporaryDirectory(prefix="fleet-bench-") as tmp:
        remote = remote_iotune(Path(tmp))
        for n in (int(x) for x in args.nodes.split(",")):
            with node_bed([CAP] * n, size_bytes=256 << 20) as bed:
                rounds = [one_round(bed, remote) for _ in range(args.rounds)]
            doc["beds"].append({"nodes": n, "rounds": rounds, "summary": summary(rounds)})
            print(f"{n} node(s): {json.dumps(doc['beds'][-1]['summary'])}", file=sys.stderr)
            out.write_text(json.dumps(doc, indent=1) + "\n")
    print(out)


if __name__ == "__main__":
    main()
