"""The one writer of the configs a sweep produces (iotune.sweep.config):
each trial's config (candidate_config) and --apply (apply_to_config), on a
user's config with keys no sweep tunes (use_gds, buffer_count, pin_memory,
an offload device, keys iotune does not know), its own key order and
4-space indentation: only the keys a sweep decided change, in the user's
own text, and the diff shows exactly those lines. Then each mode's changes,
taken from an outcome record of that mode."""

from __future__ import annotations

import difflib
import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from iotune.cli import cli
from iotune.dsconfig import ConfigReadError
from iotune.errors import IotuneError
from iotune.model.aio import AioSettings
from iotune.model.checkpoint import WriterSettings
from iotune.model.checkpoint_sweep import (DEFAULTS, CandidateResult, CheckpointCandidate, CheckpointOutcome,
                                           CheckpointRequest)
from iotune.model.offload_result import OffloadOutcome, OffloadTrial
from iotune.model.sweep import SweepPoint
from iotune.model.sweep_result import SweepOutcome
from iotune.sweep.aio.recommend import aio_changes, ds_fragment
from iotune.sweep.checkpoint.command import checkpoint_changes
from iotune.sweep.checkpoint.trial import candidate_changes
from iotune.sweep.config import REMOVE, aio_block_changes, apply_to_config, candidate_config
from iotune.sweep.offload.command import offload_changes
from iotune.sweep.offload.changes import apply_changes

USER = """{
    "zero_optimization": {
        "offload_optimizer": {
            "pin_memory": false,
            "buffer_count": 6,
            "device": "nvme",
            "nvme_path": "/mine",
            "vendor_knob": "keep me"
        },
        "stage": 3,
        "offload_param": {
            "device": "cpu",
            "pin_memory": false
        }
    },
    "aio": {
        "use_gds": true,
        "queue_depth": 32,
        "block_size": 1048576
    },
    "my_tool": {"seed": 7},
    "train_batch_size": 8,
    "bf16": {"enabled": true}
}
"""
USER_CFG: dict[str, Any] = json.loads(USER)
AIO_PICK = SweepPoint(block_size=512 << 10, queue_depth=32, intra_op_parallelism=2)


@pytest.fixture
def cfg(tmp_path: Path) -> Path:
    path = tmp_path / "ds_config.json"
    path.write_text(USER)
    return path


def without(config: dict[str, Any], keys: list[str]) -> dict[str, Any]:
    """`config` with the dotted `keys` taken out (missing ones ignored), and
    the objects that leaves empty."""
    out = json.loads(json.dumps(config))
    for key in keys:
        parts = key.split(".")
        for n in range(len(parts), 0, -1):
            where = out
            for part in parts[:n - 1]:
                where = where.get(part) if isinstance(where, dict) else None
            if not isinstance(where, dict) or (n < len(parts) and where.get(parts[n - 1]) != {}):
                break
            where.pop(parts[n - 1], None)
    return out


def key_order(config: Any) -> Any:
    """Every object's keys in their order, recursively."""
    if not isinstance(config, dict):
        return None
    return [(k, key_order(v)) for k, v in config.items()]


def at(config: dict[str, Any], key: str) -> Any:
    for part in key.split("."):
        config = config[part]
    return config


def diff_lines(diff: str) -> tuple[Counter[str], Counter[str]]:
    """The diff's removed and added lines, stripped; a line that differs only
    by the comma JSON puts after a member that is no longer last cancels out."""
    body = [line for line in diff.splitlines() if not line.startswith(("---", "+++", "@@"))]
    minus = Counter(line[1:].strip().rstrip(",") for line in body if line.startswith("-"))
    plus = Counter(line[1:].strip().rstrip(",") for line in body if line.startswith("+"))
    same = minus & plus
    return minus - same, plus - same


def assert_only(written: dict[str, Any], changes: dict[str, Any]) -> None:
    """`written` is the user's config but for `changes`: every other value,
    and every object's key order, as the user wrote it; each change is there."""
    tuned = list(changes)
    assert without(written, tuned) == without(USER_CFG, tuned)
    assert key_order(without(written, tuned)) == key_order(without(USER_CFG, tuned))
    for key, value in changes.items():
        if value is REMOVE:
            with pytest.raises(KeyError):
                at(written, key)
        else:
            assert at(written, key) == value, key


# -- candidate_config: the trials' configs ------------------------------------------

def test_a_trial_config_changes_the_changes_and_the_nvme_swap_directory_only() -> None:
    changes = aio_block_changes(AIO_PICK.aio())
    out = candidate_config(USER_CFG, changes, Path("/drive/iotune-swap-1"))
    assert out["aio"] == {"use_gds": True, "queue_depth": 32, "block_size": 524288, "intra_op_parallelism": 2,
                          "single_submit": False, "overlap_events": True}
    zero = out["zero_optimization"]
    assert zero["offload_optimizer"] == {**USER_CFG["zero_optimization"]["offload_optimizer"],
                                         "nvme_path": "/drive/iotune-swap-1"}
    assert zero["offload_param"] == {"device": "cpu", "pin_memory": False}           # not NVMe: no swap directory
    swap = [*changes, "zero_optimization.offload_optimizer.nvme_path"]
    assert without(out, swap) == without(USER_CFG, swap)
    assert key_order(without(out, list(changes))) == key_order(without(USER_CFG, list(changes)))
    assert USER_CFG == json.loads(USER)                                                # the base is not touched
    assert candidate_config(USER_CFG, {}, None) == USER_CFG


def test_a_trial_config_creates_parents_replaces_non_objects_and_removes() -> None:
    base = {**USER_CFG, "checkpoint": {"writer": {"type": "fast"}, "tag_validation": "Warn"}, "zenflow": None}
    out = candidate_config(base, {"zero_optimization.zenflow.topk_ratio": 0.1, "zenflow.enabled": True,
                                  "checkpoint.writer": REMOVE, "no.such.key": REMOVE}, None)
    assert out["zero_optimization"]["zenflow"] == {"topk_ratio": 0.1}
    assert out["zenflow"] == {"enabled": True}
    assert out["checkpoint"] == {"tag_validation": "Warn"} and "no" not in out
    with pytest.raises(IotuneError, match=r"iotune's changes set both aio and aio\.block_size: report this"):
        candidate_config(base, {"aio": {}, "aio.block_size": 1}, None)


def test_checkpoint_trials_keep_the_users_use_gds() -> None:
    """The checkpoint trials wrote the candidate's whole aio block, use_gds
    false over the user's true; now its swept keys only."""
    fast = CheckpointCandidate(WriterSettings("fast"), aio=AioSettings(block_size=8 << 20))
    out = candidate_config(USER_CFG, candidate_changes(fast), Path("/swap"))
    assert out["aio"]["use_gds"] is True and out["aio"]["block_size"] == 8 << 20
    assert out["checkpoint"] == {"writer": {"type": "fast", "io_buffer_size": 64 << 20, "io_buffer_double": True,
                                            "io_multiplier": 1}}
    assert out["zero_optimization"]["offload_optimizer"]["pin_memory"] is False
    # DeepSpeed's defaults: torch.save, a writer in the job's config removed, the job's aio
    mine = {**USER_CFG, "checkpoint": {"writer": {"type": "python"}}}
    assert candidate_config(mine, candidate_changes(DEFAULTS), None) == {**USER_CFG, "checkpoint": {}}


def test_offload_trials_keep_what_they_do_not_search() -> None:
    out = apply_changes(USER_CFG, {"zero_optimization.offload_param.device": "none",
                                   "zero_optimization.sub_group_size": 100_000_000}, "/swap")
    zero = out["zero_optimization"]
    assert "offload_param" not in zero and "stage3_prefetch_bucket_size" not in zero    # device none: dropped
    assert zero["offload_optimizer"] == {**USER_CFG["zero_optimization"]["offload_optimizer"], "nvme_path": "/swap"}
    assert out["aio"] == USER_CFG["aio"] and out["my_tool"] == {"seed": 7}
    out = apply_changes(USER_CFG, {"zero_optimization.offload_param.device": "nvme"}, "/swap")
    assert out["zero_optimization"]["offload_param"] == {"device": "nvme", "pin_memory": False, "nvme_path": "/swap"}
    assert out["zero_optimization"]["stage3_prefetch_bucket_size"] == 0                 # NVMe params need it
    given = {**USER_CFG, "zero_optimization": {**USER_CFG["zero_optimization"], "stage3_prefetch_bucket_size": 5}}
    assert apply_changes(given, {}, "/swap")["zero_optimization"]["stage3_prefetch_bucket_size"] == 5


# -- apply_to_config: --apply ---------------------------------------------------------

def test_apply_changes_only_the_tuned_lines_in_the_users_text(cfg: Path) -> None:
    changes = aio_block_changes(AIO_PICK.aio())
    applied = apply_to_config(cfg, changes, in_place=False)
    assert applied.written == cfg.with_name("ds_config.iotune.json") and cfg.read_text() == USER
    # queue_depth 32 is the user's already: not rewritten, not said changed
    assert applied.changed == ("aio.block_size", "aio.intra_op_parallelism", "aio.single_submit",
                               "aio.overlap_events")
    text = applied.written.read_text()
    assert text == USER.replace('''        "block_size": 1048576
    },''', '''        "block_size": 524288,
        "intra_op_parallelism": 2,
        "single_submit": false,
        "overlap_events": true
    },''')
    assert_only(json.loads(text), changes)
    assert applied.diff.startswith(f"--- {cfg}\n+++ {applied.written}\n@@ ")
    minus, plus = diff_lines(applied.diff)
    assert minus == Counter(['"block_size": 1048576'])
    assert plus == Counter(['"block_size": 524288', '"intra_op_parallelism": 2', '"single_submit": false',
                            '"overlap_events": true'])
    assert applied.message() == f"wrote {applied.written}\n{applied.diff.rstrip()}"


def test_apply_creates_missing_parents_in_the_files_indentation(cfg: Path) -> None:
    applied = apply_to_config(cfg, {"checkpoint.writer.type": "python", "my_tool.level": 2,
                                    "zero_optimization.offload_param.buffer_count": 10}, in_place=True)
    assert applied.written == cfg and applied.diff.startswith(f"--- {cfg}\n+++ {cfg}\n")
    text = cfg.read_text()
    assert text.endswith('''    "bf16": {"enabled": true},
    "checkpoint": {
        "writer": {
            "type": "python"
        }
    }
}
''')
    assert '    "my_tool": {"seed": 7, "level": 2},\n' in text                      # an inline object stays inline
    assert '''            "pin_memory": false,
            "buffer_count": 10
        }''' in text
    minus, plus = diff_lines(applied.diff)
    assert minus == Counter(['"my_tool": {"seed": 7}'])
    assert plus == Counter(['"my_tool": {"seed": 7, "level": 2}', '"buffer_count": 10', '"checkpoint": {',
                            '"writer": {', '"type": "python"', "}", "}"])


def test_apply_with_nothing_to_change_writes_the_same_text_and_says_so(cfg: Path) -> None:
    applied = apply_to_config(cfg, {"aio.queue_depth": 32, "aio.block_size": 1048576, "checkpoint.writer": REMOVE,
                                    "train_batch_size": 8.0}, in_place=False)
    assert applied.changed == () and applied.diff == "" and applied.written.read_text() == USER
    assert applied.message() == (f"wrote {applied.written}: no change, the config already has every value the "
                                 f"sweep decided")
    # a boolean is not a number that equals it
    assert apply_to_config(cfg, {"bf16.enabled": 1}, in_place=False).changed == ("bf16.enabled",)


def test_apply_removes_a_key_and_keeps_one_line_files_on_one_line(tmp_path: Path) -> None:
    path = tmp_path / "c.json"
    path.write_text('{"checkpoint": {"writer": {"type": "fast"}, "x": 1}, "aio": {"use_gds": true}}')
    applied = apply_to_config(path, {"checkpoint.writer": REMOVE, "aio.queue_depth": 4}, in_place=False)
    assert applied.written.read_text() == '{"checkpoint": {"x": 1}, "aio": {"use_gds": true, "queue_depth": 4}}'
    assert applied.changed == ("checkpoint.writer", "aio.queue_depth")


def test_apply_refuses_what_is_not_a_config(tmp_path: Path) -> None:
    path = tmp_path / "ds.json"
    with pytest.raises(ConfigReadError, match=f"^{path} does not exist: give your DeepSpeed config JSON$"):
        apply_to_config(path, {"aio.block_size": 1}, in_place=False)
    path.write_text('{"aio": {"block_size": 1,}}')
    with pytest.raises(ConfigReadError, match=r"is not valid JSON \(line 1, column 26\)"):
        apply_to_config(path, {"aio.block_size": 1}, in_place=False)
    assert not (tmp_path / "ds.iotune.json").exists()


# -- each mode's changes, from its outcome -------------------------------------------

def aio_outcome(point: SweepPoint | None) -> SweepOutcome:
    fragment = ds_fragment(point, "/drive") if point is not None else {}
    return SweepOutcome("/drive", "default", "fio", [], [], point, None, None, "", fragment, None, 20, 20, 0, "j")


def test_the_aio_sweep_applies_its_aio_keys_only(cfg: Path) -> None:
    outcome = aio_outcome(AIO_PICK)
    changes = aio_changes(outcome)
    assert changes == {"aio.block_size": 524288, "aio.queue_depth": 32, "aio.intra_op_parallelism": 2,
                       "aio.single_submit": False, "aio.overlap_events": True}
    written = json.loads(apply_to_config(cfg, changes, in_place=False).written.read_text())
    assert_only(written, changes)
    # what the printed fragment has and --apply never writes
    assert written["aio"]["use_gds"] is True and outcome.fragment["aio"]["use_gds"] is False  # type: ignore[index]
    assert written["zero_optimization"] == USER_CFG["zero_optimization"]
    assert aio_changes(aio_outcome(None)) == {}


def offload_outcome(changes: dict[str, Any]) -> OffloadOutcome:
    """What search_offload records for a confirmed pick: the trial, the
    dotted changes, and the recommended config as its trials ran it."""
    best = OffloadTrial(json.dumps(changes, sort_keys=True), changes, "ok", samples_per_s=3.0, step_s=1.0)
    return OffloadOutcome("train.py", {}, (), (), (), (best,), best, (1.2, 1.25, 1.22), "faster", "j",
                          apply_changes(USER_CFG, changes, "/mine"), {k: "faster" for k in changes},
                          recommended_changes=changes)


def test_the_offload_sweep_applies_its_knob_changes_only(cfg: Path) -> None:
    knobs = {"zero_optimization.offload_param.device": "nvme", "zero_optimization.sub_group_size": 250_000_000,
             "zero_optimization.offload_optimizer.pipeline_read": True,
             "zero_optimization.offload_optimizer.buffer_count": 8}
    outcome = offload_outcome(knobs)
    assert outcome.recommended == knobs                            # already dotted
    changes = offload_changes(outcome)
    # parameters moved to NVMe: the swap directory and the prefetch setting their trials ran with
    assert changes == {**knobs, "zero_optimization.offload_param.nvme_path": "/mine",
                       "zero_optimization.stage3_prefetch_bucket_size": 0}
    applied = apply_to_config(cfg, changes, in_place=False)
    assert applied.changed == tuple(changes)
    written = json.loads(applied.written.read_text())
    assert_only(written, changes)
    assert written["aio"] == USER_CFG["aio"] and written["zero_optimization"]["offload_optimizer"]["pin_memory"] \
        is False
    minus, plus = diff_lines(applied.diff)
    assert minus == Counter(['"buffer_count": 6', '"device": "cpu"'])
    assert plus == Counter(['"buffer_count": 8', '"device": "nvme"', '"pipeline_read": true',
                            '"sub_group_size": 250000000', '"nvme_path": "/mine"',
                            '"stage3_prefetch_bucket_size": 0'])
    # a pick that moves nothing to NVMe adds nothing
    assert offload_changes(offload_outcome({"zero_optimization.sub_group_size": 10 ** 8})) == {
        "zero_optimization.sub_group_size": 10 ** 8}


def checkpoint_outcome(best: CheckpointCandidate | None) -> CheckpointOutcome:
    q = CheckpointRequest(swap_dir="/drive", out_dir="/out")
    result = (lambda c: CandidateResult(c, 1, True, 1.0, 1.0, 10.0, 0))
    return CheckpointOutcome(q, (), (result(DEFAULTS),), result(DEFAULTS), result(best) if best else None)


def test_the_checkpoint_sweep_applies_its_writer_and_aio_keys_only(cfg: Path) -> None:
    fast = CheckpointCandidate(WriterSettings("fast", io_buffer_size=16 << 20), target="/other",
                               dirty_limit_bytes=32 << 20, aio=AioSettings(block_size=8 << 20))
    changes = checkpoint_changes(checkpoint_outcome(fast))
    assert set(changes) == {"checkpoint.writer", "aio.block_size", "aio.queue_depth", "aio.intra_op_parallelism",
                            "aio.single_submit", "aio.overlap_events"}
    applied = apply_to_config(cfg, changes, in_place=False)
    written = json.loads(applied.written.read_text())
    assert_only(written, changes)
    assert written["aio"]["use_gds"] is True and "/other" not in applied.written.read_text()
    minus, plus = diff_lines(applied.diff)
    assert minus == Counter(['"queue_depth": 32', '"block_size": 1048576'])
    assert plus == Counter(['"queue_depth": 8', '"block_size": 8388608', '"intra_op_parallelism": 1',
                            '"single_submit": false', '"overlap_events": true', '"checkpoint": {', '"writer": {',
                            '"type": "fast"', '"io_buffer_size": 16777216', '"io_buffer_double": true',
                            '"io_multiplier": 1', "}", "}"])
    # the defaults won: nothing in this config to change (it has no writer block)
    assert apply_to_config(cfg, checkpoint_changes(checkpoint_outcome(DEFAULTS)), in_place=False).changed == ()
    assert checkpoint_changes(checkpoint_outcome(None)) == {}


def test_the_offload_mode_prints_wrote_and_the_diff_on_stderr(cfg: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    knobs = {"zero_optimization.sub_group_size": 250_000_000}
    monkeypatch.setattr("iotune.sweep.offload.command.run_offload_command", lambda args, say: offload_outcome(knobs))
    r = CliRunner().invoke(cli, ["sweep", "offload", "--model", "tiny", "--apply", str(cfg), "--json"])
    assert r.exit_code == 0, r.output
    written = cfg.with_name("ds_config.iotune.json")
    assert r.stderr == (f"wrote {written}\n--- {cfg}\n+++ {written}\n@@ -11,7 +11,8 @@\n"
                        '         "offload_param": {\n'
                        '             "device": "cpu",\n'
                        '             "pin_memory": false\n'
                        '-        }\n'
                        '+        },\n'
                        '+        "sub_group_size": 250000000\n'
                        '     },\n'
                        '     "aio": {\n'
                        '         "use_gds": true,\n')
    assert json.loads(r.stdout)["recommended"] == knobs                     # stdout: the report only


@pytest.mark.parametrize("mode", ["aio", "checkpoint", "offload"])
def test_each_modes_apply_writes_only_its_tuned_keys_and_prints_exactly_that_diff(
        mode: str, cfg: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Through the command line, each mode's sweep stood in by its outcome:
    the written file equals the user's but for the mode's tuned keys, and
    stderr carries `wrote PATH` and the diff of the two files, nothing else."""
    fast = CheckpointCandidate(WriterSettings("fast", io_buffer_size=16 << 20), aio=AioSettings(block_size=8 << 20))
    knobs = {"zero_optimization.sub_group_size": 250_000_000}
    outcomes = {"aio": aio_outcome(AIO_PICK), "checkpoint": checkpoint_outcome(fast), "offload": offload_outcome(knobs)}
    changes = {"aio": aio_changes, "checkpoint": checkpoint_changes, "offload": offload_changes}[mode](outcomes[mode])
    monkeypatch.setattr("iotune.sweep.aio.command.run_sweep_command", lambda args, say, on_trial: (outcomes[mode], None))
    monkeypatch.setattr("iotune.sweep.checkpoint.command.run_checkpoint_command", lambda args, say: outcomes[mode])
    monkeypatch.setattr("iotune.sweep.offload.command.run_offload_command", lambda args, say: outcomes[mode])
    r = CliRunner().invoke(cli, ["sweep", mode, "--model", "tiny", "--apply", str(cfg), "--json"])
    assert r.exit_code == 0, r.output
    written = cfg.with_name("ds_config.iotune.json")
    assert_only(json.loads(written.read_text()), changes)
    diff = "".join(difflib.unified_diff(cfg.read_text().splitlines(keepends=True),
                                        written.read_text().splitlines(keepends=True), str(cfg), str(written)))
    assert r.stderr == f"wrote {written}\n{diff}"
    assert json.loads(r.stdout)                                             # stdout: the report only
