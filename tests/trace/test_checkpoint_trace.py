"""A traced job's checkpoints: the hook's events parsed into calls and parts
(the decoupled writer's subprocess matched by path), and the rows and
verdict note derived from them, on hand-built records with known figures."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from iotune.analysis.checkpoints import checkpoint_findings, checkpoint_rows
from iotune.analysis.verdict import judge
from iotune.model.checkpoint_io import checkpoint_part
from iotune.model.hook_events import read_events, read_losses
from iotune.model.verdict import DeviceCeiling, VerdictInputs
from iotune.render.base import RenderOptions
from iotune.render.registry import render
from iotune.model.verdict import TraceReport

from iotune.blockdev.targets import path_target
from iotune.trace.applayer import AppOptions
from iotune.trace.session import TraceOptions, trace_command

from tests.conftest import needs_bpf, needs_deepspeed
from tests.records import checkpointed_run


def test_files_are_named_to_their_part() -> None:
    assert checkpoint_part("/c/global_step2/zero_pp_rank_0_mp_rank_00_model_states.pt") == "model states"
    assert checkpoint_part("/c/global_step2/mp_rank_00_model_states.pt-0.1") == "model states"   # fast writer, DP
    assert checkpoint_part("/c/global_step2/bf16_zero_pp_rank_3_mp_rank_00_optim_states.pt") == "optimizer partitions"
    assert checkpoint_part("/c/global_step2/offloaded_tensors/rank00/exp_avg-0_38.tensor.swp") == "offloaded tensors"
    assert checkpoint_part("/c/zero_to_fp32.py") == "recovery scripts"
    assert checkpoint_part("/c/latest") == "latest"
    assert checkpoint_part("/c/global_step2/notes.txt") is None


def _events(d: Path, pid: int, rank: int, events: list[dict[str, object]]) -> None:
    lines = [{"k": "proc", "pid": pid, "rank": rank, "argv": [], "omp": None, "node": "n"}, *events]
    (d / f"events-{pid}.jsonl").write_text("".join(json.dumps(e) + "\n" for e in lines))


def test_parts_are_matched_to_their_call_by_path_whichever_process_did_them(tmp_path: Path) -> None:
    d = "/ckpt/global_step2"
    _events(tmp_path, 100, 0, [
        {"k": "ckio", "w": "save", "p": f"{d}/zero_pp_rank_0_mp_rank_00_model_states.pt", "t0": 1010, "t1": 1020},
        {"k": "ckio", "w": "handoff", "p": f"{d}/zero_pp_rank_0_mp_rank_00_optim_states.pt", "t0": 1020, "t1": 1021},
        {"k": "ckio", "w": "scripts", "p": "/ckpt/zero_to_fp32.py", "t0": 1030, "t1": 1031},
        {"k": "ckio", "w": "copy", "p": f"{d}/offloaded_tensors/rank00/", "t0": 1040, "t1": 1090},
        {"k": "ckcall", "op": "save", "dir": d, "s": 2, "t0": 1000, "t1": 1100, "mem": 7,
         "files": [[f"{d}/zero_pp_rank_0_mp_rank_00_model_states.pt", 21089, 24576, 0],
                   [f"{d}/offloaded_tensors/rank00/0_38.tensor.swp", 8192, 4096, 4096]]},
        {"k": "ckio", "w": "save", "p": "/other/global_step1/mp_rank_00_model_states.pt", "t0": 1200, "t1": 1210},
        {"k": "ckio", "w": "commit", "p": f"{d}/", "t0": 1300, "t1": 1400},
        {"k": "loss", "s": 0, "v": 6.062740325927734}, {"k": "loss", "s": 1, "v": 5.964502334594727}])
    # the decoupled writer's subprocess: the same rank, another pid, its write after the call returned
    _events(tmp_path, 4242, 0, [
        {"k": "ckio", "w": "save", "p": f"{d}/zero_pp_rank_0_mp_rank_00_optim_states.pt", "t0": 1150, "t1": 1250}])
    att = read_events(tmp_path)
    assert att is not None
    [call] = att.checkpoints
    assert (call.op, call.directory, call.step, call.pid, call.meminfo_dirty_bytes) == ("save", d, 2, 100, 7)
    parts = [(i.part, i.pid, i.t0_ns) for i in call.io]
    assert parts == [("model states", 100, 1010), ("optimizer partitions", 100, 1020),
                     ("recovery scripts", 100, 1030), ("offloaded tensors", 100, 1040),
                     ("optimizer partitions", 4242, 1150), ("writer wait", 100, 1300)]
    # dirty pages are whole pages: at most the file's size is not durable
    assert [f.not_durable_bytes for f in call.files] == [21089, 8192] and call.not_durable_bytes() == 29281
    assert read_losses(tmp_path) == {0: [(0, 6.062740325927734), (1, 5.964502334594727)]}


def test_rows_split_a_save_into_parts_on_both_layers() -> None:
    run = checkpointed_run()
    save, load = checkpoint_rows(run)
    assert (save.op, save.file_bytes, save.not_durable_bytes, save.seconds) == ("save", 12_000_000, 4_000_000, 0.2)
    assert save.durable_bytes_per_s == pytest.approx(8_000_000 / 0.2)
    parts = {p.part: p for p in save.parts}
    off = parts["offloaded tensors"]
    # the application layer counts bytes done (10 MB), not the 20 MB asked for
    assert (off.file_bytes, off.not_durable_bytes, off.app_bytes, off.pids) == (10_000_000, 4_000_000, 10_000_000,
                                                                                  (100,))
    assert off.block_bytes == pytest.approx(6_000_000) and parts["model states"].block_bytes == 0
    opt = parts["optimizer partitions"]
    assert (opt.pids, opt.seconds) == ((4242,), pytest.approx(0.01))
    assert (load.op, load.loaded, load.not_durable_bytes) == ("load", True, None)
    assert {p.part: p.app_bytes for p in load.parts}["offloaded tensors"] == 10_000_000


def test_the_verdict_notes_each_save_against_the_write_ceiling() -> None:
    run = checkpointed_run()
    inputs = VerdictInputs(ceilings=(DeviceCeiling("loop0", 1e8, "test", write_bytes_per_s=1e8),))
    [note] = checkpoint_findings(run, inputs)
    assert note.figures["durable_bytes_per_s"] == pytest.approx(4e7)
    assert "40.0 MB/s durable, 40% of loop0's write ceiling (100.0 MB/s)" in note.headline
    assert "4.00 MB were still in the page cache when it returned, not yet durable" in note.headline
    assert note in judge(run, inputs).findings
    [without] = checkpoint_findings(run, VerdictInputs())
    assert "ceiling" not in without.headline and without.figures["write_ceiling_bytes_per_s"] is None


@pytest.mark.parametrize("fmt", ["console", "html"])
def test_reports_show_every_part(fmt: str) -> None:
    out = render(TraceReport(checkpointed_run()), fmt, RenderOptions(width=160))
    for text in ("save /ckpt/global_step4", "offloaded tensors", "optimizer partitions", "4242"):
        assert text in out


@needs_bpf
@needs_deepspeed
def test_the_decoupled_writers_io_is_attributed_by_path(tmp_path: Path) -> None:
    """A real trace (block and application layers) of the built-in workload
    saving with the decoupled fast writer (on the CPU accelerator through the
    hook's workaround): the writer's subprocess writes the model-state and
    optimizer files with another pid, after save_checkpoint returned; both
    layers give those bytes to their part by path."""
    swap, ckpt = tmp_path / "swap", tmp_path / "ckpt"
    swap.mkdir()
    cfg = json.loads(subprocess.run([sys.executable, "-m", "iotune.workloads.train", "--strategy", "nvme-opt",
                                     "--size", "tiny", "--nvme-path", str(swap), "--print-config"],
                                    capture_output=True, text=True, check=True).stdout)
    cfg["checkpoint"] = {"writer": {"type": "fast", "decoupled": True}}
    (tmp_path / "ds.json").write_text(json.dumps(cfg))
    target = path_target(str(swap))
    opts = TraceOptions(devices=target.devices, app=AppOptions(targets=(path_target(str(tmp_path)),)),
                        stdout_to_stderr=True, inject=True)
    job = [sys.executable, "-W", "ignore", "-m", "iotune.workloads.train", "--ds-config", str(tmp_path / "ds.json"),
           "--size", "tiny", "--steps", "3", "--save-at", "1", "--checkpoint-dir", str(ckpt)]
    os.environ["IOTUNE_CPU_FAST_WRITER"] = "1"
    try:
        run = trace_command(job, opts)
    finally:
        del os.environ["IOTUNE_CPU_FAST_WRITER"]
    assert run.exit_status == 0
    [save] = checkpoint_rows(run)
    assert run.attribution is not None
    [call] = run.attribution.checkpoints
    parts = {p.part: p for p in save.parts}
    writer_pids = set(parts["model states"].pids) - {call.pid}
    assert writer_pids, parts["model states"]                    # the subprocess wrote it
    assert parts["writer wait"].seconds > 0                      # the commit at the next step waited for it
    on_disk = sum(p.stat().st_size for p in (ckpt / "global_step1").glob("*model_states.pt"))
    assert on_disk > 0
    app = sum(f.result_bytes for f in run.app.files if f.op == "write" and f.path.endswith("model_states.pt"))
    assert app == on_disk                                        # the application layer, by path
