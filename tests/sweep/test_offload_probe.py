"""The offload search's first start of the job (stopped at
deepspeed.initialize, to see its tensors and its memory) is journaled: a
resumed search takes it from the journal and does not start the job again.
A start that measured no memory is not journaled, so a resume tries it
again. (The real path, the built-in model's start and its resume:
tests/sweep/test_offload_search.py.)"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from iotune.errors import IotuneError
from iotune.model.hook_events import JobTensors, StartupMemory
from iotune.model.offload import JobShape
from iotune.model.offload_result import JobProbe
from iotune.sweep.executor import Target
from iotune.sweep.journal import Journal
from iotune.sweep.offload.probe import job_shape
from iotune.sweep.offload.runner import RunResult, TrialPlan
from iotune.sweep.offload.search import OffloadSearch

MEMORY = StartupMemory(rss_bytes=900 << 20, peak_rss_bytes=950 << 20, param_storage_bytes=100 << 20)
SEEN = JobTensors((4096, 4096, 64), world=2, micro_batch=1, partition_dtype="bf16", startup=MEMORY)
CMD = "`python train.py --deepspeed_config {config}`"


@dataclass
class Job:
    """A stand-in for the user's command: what its hook reports at deepspeed.initialize, and each start."""

    seen: JobTensors | None
    starts: list[dict[str, Any]] = field(default_factory=list)

    @property
    def what(self) -> str:
        return CMD

    @property
    def seq_len(self) -> int:
        return 0

    def run(self, cfg: dict[str, Any], work: Path, cgroup: str | None, plan: TrialPlan) -> RunResult:
        raise AssertionError("the probe runs no trial")

    def probe(self, cfg: dict[str, Any], work: Path, cgroup: str | None,
              timeout_s: float) -> tuple[JobTensors | None, str]:
        self.starts.append(cfg)
        return self.seen, "" if self.seen else "no DeepSpeed engine was seen"


def shape_of(job: Job, tmp_path: Path, said: list[str]) -> tuple[JobShape, str, StartupMemory | None]:
    p = job_shape(OffloadSearch({"zero_optimization": {"stage": 3}}, job), Target(tmp_path),
                  Journal(tmp_path / "journal.jsonl"), said.append)
    return p.shape, p.partition_dtype, p.startup


def test_a_resumed_search_takes_the_jobs_start_from_the_journal(tmp_path: Path) -> None:
    job, said = Job(SEEN), []
    first = shape_of(job, tmp_path, said)
    assert first == (JobShape((4096, 4096, 64), 2), "bf16", MEMORY) and len(job.starts) == 1
    assert said == [f"offload: starting {CMD} up to deepspeed.initialize, to see its tensors and its memory there"]
    again, said = shape_of(job, tmp_path, []), []
    assert again == first and len(job.starts) == 1                 # not started again
    shape_of(job, tmp_path, said)
    assert said == [f"offload: {CMD} up to deepspeed.initialize: from the journal (the start that showed it is not "
                    f"run again)"]
    [probe] = Journal(tmp_path / "journal.jsonl").probes
    assert probe == JobProbe(CMD, JobShape((4096, 4096, 64), 2), "bf16", MEMORY)
    assert JobProbe.from_json(probe.to_json()) == probe


def test_a_start_without_its_memory_is_tried_again_and_one_without_tensors_is_an_error(tmp_path: Path) -> None:
    job = Job(JobTensors((64,), world=1, micro_batch=1))           # an older hook: no memory reported
    assert shape_of(job, tmp_path, []) == (JobShape((64,), 1), "", None)
    shape_of(job, tmp_path, [])
    assert len(job.starts) == 2 and Journal(tmp_path / "journal.jsonl").probes == []
    (tmp_path / "none").mkdir()
    with pytest.raises(IotuneError, match="your command reported no DeepSpeed model"):
        shape_of(Job(None), tmp_path / "none", [])


def test_a_journal_with_a_probe_loads_where_only_trials_were_known(tmp_path: Path) -> None:
    """An older journal (no probe) loads with none; a probe of another job is not this one's."""
    (tmp_path / "old.jsonl").write_text('{"kind":"header","version":1,"env":{"mode":"offload"}}\n'
                                        '{"kind":"offload-trial","key":"{}","changes":{},"status":"ok"}\n')
    assert Journal(tmp_path / "old.jsonl").probes == []
    j = Journal(tmp_path / "j.jsonl")
    j.record_probe(JobProbe("`other`", JobShape((1,)), "", MEMORY))
    assert Journal(tmp_path / "j.jsonl").find_probe(CMD) is None
    assert Journal(tmp_path / "j.jsonl").find_probe("`other`") is not None


def test_a_full_disk_names_the_record_of_the_start(tmp_path: Path) -> None:
    said = Journal(tmp_path / "j.jsonl")._full({"kind": "offload-probe"}, "No space left on device")
    assert said.startswith(f"disk full: the sweep journal {tmp_path / 'j.jsonl'} cannot take the record of the "
                           f"job's start (No space left on device); it keeps the 0 trial(s) completed before it, "
                           f"every line whole, and the job starts again on resume: free space on that drive")
