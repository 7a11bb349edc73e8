"""`iotune doctor --ds-config`: will this job's NVMe offload work here?
One CheckResult per question, each with its fix. The config rules are
`iotune lint`'s, the space and memory figures `iotune plan`'s; what this
adds is what only the machine can answer: the async_io op loading, O_DIRECT
at DeepSpeed's alignment, free space, locked memory against `ulimit -l` and
the container's limit, another job on the same nvme_path, and op-build
locks a killed build left behind."""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from typing import Any

from ..analysis.lint import lint, swap_paths
from ..analysis.lint.memory import assumptions, describe, job_memory
from ..analysis.lint.view import aio_block, as_int
from ..opbuild import oplocks
from ..fs.directio import direct_io_problem
from ..model import units
from ..model.checks import CheckResult
from ..model.host_memory import Accelerator, HostMemory, MemoryItem, host_fit
from ..host.memory import ram_bytes
from ..model.lint import LintEnv, PathFacts
from ..model.offload import OffloadKnobs, nvme_space
from . import jobfacts
from ..workloads.fastops import prebuilt_ops
from .checkpoint import checkpoint_checks
from .facts import gather

AIO_ALIGNED_BYTES = 1024        # DeepSpeed pads swap I/O to this x intra_op_parallelism
AIO_FIX = ("apt-get install libaio-dev (RHEL: yum install libaio-devel), then the op builds on first use; libaio "
           "elsewhere: set CFLAGS=-I<prefix>/include LDFLAGS=-L<prefix>/lib; or prebuild it: "
           "DS_BUILD_AIO=1 DS_BUILD_PIN_MEMORY=1 LDFLAGS='-Wl,--no-as-needed -laio' pip install --force-reinstall "
           "--no-deps --no-build-isolation --no-cache-dir deepspeed (or iotune's scripts/setup.sh)")
DOCTOR_STATUS = {"fits": "ok", "tight": "warn", "over": "fail"}      # host_fit's verdict as a check's status
LINT_OWN = ("nvme-path-", "pinned-", "checkpoint-dir-", "checkpoint-space", "host-memory")   # lint rules doctor answers itself


@dataclass(frozen=True)
class Job:
    """The job as doctor sees it: its config and, when given, the model size."""

    cfg: dict[str, Any]
    params: int | None = None
    numels: tuple[int, ...] = ()          # the model's tensors, where known (--model)
    largest_param_numel: int | None = None
    gpus: int = 1
    baseline_bytes: int = 0               # a process with torch and DeepSpeed (measured; 0: not counted)
    accelerator: str | None = None        # the accelerator modelled (cpu: its memory is the host's); None: unknown
    checkpoint_dir: str | None = None
    keep: int = 1
    modelled: Accelerator | None = None   # the accelerator the host memory is modelled for, and why
    baseline_note: str = ""               # what baseline_bytes is, or why it is not counted
    activation_bytes: int = 0             # one micro-batch's activations, where the model is known (--model)
    activation_note: str = ""             # how they were reckoned

    @property
    def accelerator_modelled(self) -> Accelerator:
        return self.modelled or Accelerator(self.accelerator or "cuda", reason="unknown here: cuda assumed")


def job_checks(job: Job, aio_timeout_s: float = 300.0, env: dict[str, str] | None = None) -> list[CheckResult]:
    paths = swap_paths(job.cfg)
    lint_env = replace(gather(list(paths), job.params, job.largest_param_numel, job.accelerator, job.gpus, None,
                              job.checkpoint_dir, job.keep), numels=job.numels, baseline_bytes=job.baseline_bytes,
                       activation_bytes=job.activation_bytes, activation_note=job.activation_note)
    locks = oplocks.build_locks(oplocks.extension_roots(env))
    out = [check_accelerator(job, lint_env), check_config(job, lint_env), check_async_io(locks, aio_timeout_s, env)]
    if not paths:
        out.append(CheckResult("nvme_path", "skip", "the config swaps nothing to NVMe (no nvme offload at stage 3)",
                               data={"nvme_paths": 0}))
    for path, users in paths.items():
        facts = lint_env.paths[path]
        out += [check_direct_io(job, path, facts), check_space(job, path, users, facts), check_sharing(path)]
    out += check_memory(job, lint_env)
    out += checkpoint_checks(job.cfg, lint_env)
    out += [check_lock(lock) for lock in locks] or [CheckResult("op-build locks", "ok", "none in the torch "
                                                                "extensions cache", data={"locks": 0})]
    return out


def check_accelerator(job: Job, env: LintEnv) -> CheckResult:
    """Which accelerator the checks model and why (warn: unknown here, cuda
    assumed), and what of the config needs CUDA (GDS)."""
    acc = job.accelerator_modelled
    use_gds = aio_block(job.cfg).get("use_gds") is True
    data = {**acc.to_json(), "device_memory_is_host": acc.device_is_host, "use_gds": use_gds,
            "gds_available": env.gds_available}
    gds = ("; aio.use_gds needs CUDA: DeepSpeed refuses it here" if use_gds and acc.name != "cuda" else
           "; aio.use_gds: libcufile (GDS) not found" if use_gds and env.gds_available is False else "")
    if job.accelerator is None:
        return CheckResult("accelerator", "warn", f"{acc.sentence}{gds}",
                           "give --accelerator cpu or cuda: the one the job runs on", data=data)
    return CheckResult("accelerator", "ok", f"{acc.sentence}{gds}", data=data)


def check_config(job: Job, env: LintEnv) -> CheckResult:
    found = [f for f in lint(job.cfg, env) if not f.rule.startswith(LINT_OWN)]
    errors = [f for f in found if f.severity == "error"]
    data = {"errors": len(errors), "warnings": len(found) - len(errors), "rules": [f.rule for f in found]}
    if errors:
        more = f" (and {len(errors) - 1} more: run `iotune lint`)" if len(errors) > 1 else ""
        return CheckResult("ds_config", "fail", f"{errors[0].where}: {errors[0].message}{more}", errors[0].fix,
                           data=data)
    if found:
        return CheckResult("ds_config", "warn", f"{found[0].where}: {found[0].message}"
                           + (f" (+{len(found) - 1} more)" if len(found) > 1 else ""), "see `iotune lint`", data=data)
    return CheckResult("ds_config", "ok", "DeepSpeed accepts it (iotune lint finds nothing)", data=data)


ASYNC_IO = "async_io op"      # the check's name, also in the helpers that make its failures


def check_async_io(locks: list[oplocks.BuildLock], timeout_s: float, env: dict[str, str] | None) -> CheckResult:
    if prebuilt_ops(("async_io", "pin_memory")) != ["async_io", "pin_memory"]:   # a JIT load: locks matter
        lock = _lock_problem(locks)
        if lock is not None:
            return lock
    probe = jobfacts.probe_async_io(timeout_s, env)
    data = {"loaded": probe.loaded, "prebuilt": probe.prebuilt, "timeout_s": timeout_s}
    if probe.loaded:
        how = "prebuilt into DeepSpeed: nothing compiled" if probe.prebuilt else "libaio found, op built"
        return CheckResult(ASYNC_IO, "ok", f"AsyncIOBuilder().load() works ({how})", data=data)
    return replace(_probe_failure(probe), data={**data, "timed_out": probe.timed_out})


def _lock_problem(locks: list[oplocks.BuildLock]) -> CheckResult | None:
    """A JIT load of the op would wait on one of these build locks."""
    stale = [lk for lk in locks if lk.op == "async_io" and lk.stale]
    if stale:
        return CheckResult(ASYNC_IO, "fail", f"loading it would wait forever on the stale build lock {stale[0].path}",
                           f"rm {stale[0].path}", fixable=True, target=stale[0].path)
    building = [lk for lk in locks if lk.op == "async_io" and not lk.orphaned]
    if building:
        pid = (building[0].builders or building[0].holders)[0]
        return CheckResult(ASYNC_IO, "warn", f"being built right now by pid {pid} ({jobfacts.command_of(pid)}): a job "
                           "started now waits for it", "rerun `iotune doctor --ds-config` when the build is done")
    return None


def _probe_failure(probe: jobfacts.AioProbe) -> CheckResult:
    if probe.timed_out:
        return CheckResult(ASYNC_IO, "fail", f"AsyncIOBuilder().load() gave {probe.error}: a build is running or "
                           "waiting on a lock", "wait for the build, or find its lock under the torch extensions "
                           "cache ($TORCH_EXTENSIONS_DIR or ~/.cache/torch_extensions) and remove it")
    if "No module named 'deepspeed" in probe.error:
        return CheckResult(ASYNC_IO, "skip", "DeepSpeed is not installed in this Python", "pip install deepspeed")
    if probe.compatible is False:
        return CheckResult(ASYNC_IO, "fail", "libaio not found: AsyncIOBuilder.is_compatible() cannot link io_submit "
                           "with -laio, so NVMe offload fails at startup", AIO_FIX)
    return CheckResult(ASYNC_IO, "fail", f"AsyncIOBuilder().load() failed: {probe.error}",
                       "an old or broken libaio, or a failed build: " + AIO_FIX)


def _aligned_bytes(cfg: dict[str, Any]) -> int:
    return AIO_ALIGNED_BYTES * max(as_int(aio_block(cfg).get("intra_op_parallelism", 1)) or 1, 1)


def check_direct_io(job: Job, path: str, facts: PathFacts) -> CheckResult:
    name = f"O_DIRECT on {path}"
    where = facts.checked or path
    if facts.unmounted_mount_point:
        return CheckResult(name, "fail", f"under {facts.unmounted_mount_point}, an fstab mount point that is not "
                           "mounted", f"mount {facts.unmounted_mount_point} first")
    if facts.not_a_directory or not facts.writable:
        return CheckResult(name, "fail", f"{where} is not a writable directory", "give nvme_path a writable directory")
    if facts.direct_io_problem:
        return CheckResult(name, "fail", f"{where}: {facts.direct_io_problem}",
                           "put nvme_path on ext4, xfs or btrfs on a block device (not tmpfs, ramfs or most FUSE)")
    align = _aligned_bytes(job.cfg)
    small = direct_io_problem(where, align)
    data = {"checked": where, "alignment_bytes": align, "page_bytes": 4096}
    if small:
        return CheckResult(name, "fail", f"{where}: {small}; DeepSpeed pads swap I/O only to {align} B",
                           "raise aio.intra_op_parallelism so 1024 x it is a multiple of the drive's logical "
                           "block size, or use a drive formatted with 512 B sectors", data=data)
    return CheckResult(name, "ok", f"{where}: O_DIRECT works at 4 KiB and at DeepSpeed's {align} B alignment",
                       data=data)


def nvme_bytes(job: Job, users: list[str]) -> int | None:
    """What the job's swap files take on this nvme_path (iotune.model.offload), for the offloads that use it."""
    if not job.params and not job.numels:
        return None
    shape, _ = assumptions(job.cfg, LintEnv(params=job.params, numels=job.numels,
                                            largest_param_numel=job.largest_param_numel, gpus=job.gpus))
    space = nvme_space(OffloadKnobs.from_ds_config(job.cfg), shape)
    total = 0
    if "offload_optimizer" in users:
        total += sum(v for k, v in space.items() if k != "weights")
    if "offload_param" in users:
        total += space.get("weights", 0)
    return total


def check_space(job: Job, path: str, users: list[str], facts: PathFacts) -> CheckResult:
    name = f"free space on {path}"
    need = nvme_bytes(job, users)
    if need is None:
        return CheckResult(name, "skip", "model size unknown", "give --model or --params")
    if facts.free_bytes is None:
        return CheckResult(name, "skip", "cannot see the filesystem under it")
    reusable = sum(size for _, size in jobfacts.swap_dirs(path)) if os.path.isdir(path) else 0
    have = facts.free_bytes + reusable
    note = f" + {units.mib(reusable)} in swap files DeepSpeed rewrites" if reusable else ""
    detail = f"{units.mib(facts.free_bytes)} free{note}; the plan puts {units.mib(need)} there ({', '.join(users)})"
    data = {"need_bytes": need, "free_bytes": facts.free_bytes, "reusable_bytes": reusable, "have_bytes": have,
            "users": list(users)}
    if have < need:
        return CheckResult(name, "fail", detail, "free space, or point nvme_path at a larger volume "
                           "(`iotune plan` for the breakdown)", data=data)
    return CheckResult(name, "ok", detail, data=data)


def check_sharing(path: str) -> CheckResult:
    name = f"nvme_path shared? {path}"
    if not os.path.isdir(path):
        return CheckResult(name, "ok", "does not exist yet: no other job uses it")
    users = jobfacts.open_under(path)
    if users:
        pid, files = next(iter(sorted(users.items())))
        return CheckResult(name, "fail", f"pid {pid} ({jobfacts.command_of(pid)}) holds {len(files)} file(s) open "
                           f"under it, e.g. {files[0]}: two jobs write the same rank<N> swap files",
                           "give each job its own nvme_path (a subdirectory per job)",
                           data={"pids": sorted(users), "open_files": len(files)})
    dirs = jobfacts.swap_dirs(path)
    if dirs:
        size = sum(s for _, s in dirs)
        return CheckResult(name, "warn", f"swap directories of an earlier job ({len(dirs)}, {units.mib(size)}, e.g. "
                           f"{dirs[0][0]}); no process has them open now", "if that job runs elsewhere (another "
                           "container or node on shared storage), give each job its own nvme_path",
                           data={"swap_dirs": len(dirs), "swap_bytes": size})
    return CheckResult(name, "ok", "no other process has files open under it, no earlier swap files")


def check_memory(job: Job, env: LintEnv) -> list[CheckResult]:
    """Locked memory against ulimit -l, and one rank's peak (iotune.model.host_memory) x the ranks against
    the host's RAM, what is available now and the container's limit."""
    memory, notes = job_memory(job.cfg, env)
    locked = [i for i in memory.items if i.locked]
    pinned = sum(i.nbytes for i in locked)
    out = [_memlock(env, pinned, describe(locked))] if pinned else []
    if not (env.params or env.numels):
        return out
    ranks = max(job.gpus, 1)
    host = memory.peak_bytes * ranks
    cg = jobfacts.cgroup_memory_limit()
    budgets = {"ram_bytes": env.ram_bytes, "available_bytes": ram_bytes("MemAvailable"),
               "cgroup_limit_bytes": cg[0] if cg else None}
    limits = [(b, what) for b, what in ((env.ram_bytes, "RAM"), (budgets["available_bytes"], "available now "
                                        "(MemAvailable)")) if b]
    if cg:
        limits.append((cg[0], f"the container's limit ({cg[1]})"))
    if not limits:
        return out
    limit, which = min(limits)
    assumed = f" [{'; '.join(notes)}]" if notes else ""
    acc = job.accelerator_modelled
    text = (f"{units.mib(host)} of host memory at the peak for {ranks} rank(s) on the {acc.name} accelerator "
            f"({memory.peak_phase()}: {describe(peak_items(memory))}){assumed} against {units.mib(limit)}, {which}")
    fit = host_fit(host, limit)
    data = {**memory_data(job, memory, ranks), **budgets, "budget_bytes": limit, "budget": which,
            "verdict": fit.verdict, "margin": fit.margin, "assumptions": notes}
    out.append(CheckResult("host memory", DOCTOR_STATUS[fit.verdict], text, "lower sub_group_size (the "
                           "optimizer's swap buffers and step-1 moments scale with the largest sub-group) or the "
                           "buffer counts, or raise the memory limit; `iotune sweep offload` searches what fits",
                           data=data))
    return out


def peak_items(memory: HostMemory) -> list[MemoryItem]:
    """The items the peak sums: the resident ones and the peak phase's transients."""
    return [i for i in memory.items if i.phase in ("resident", memory.peak_phase())]   # as HostMemory.peak_bytes


def memory_data(job: Job, memory: HostMemory, ranks: int) -> dict[str, Any]:
    """The host-memory check's numbers: one rank's peak (what `plan --json` gives as host.peak_bytes for the
    same config and accelerator) and each term of the model, all in bytes."""
    acc = job.accelerator_modelled
    peak = ("resident", memory.peak_phase())
    return {"accelerator": acc.name, "accelerator_source": acc.source, "accelerator_reason": acc.reason,
            "ranks": ranks, "peak_bytes": memory.peak_bytes, "total_peak_bytes": memory.peak_bytes * ranks,
            "peak_phase": memory.peak_phase(), "resident_bytes": memory.resident_bytes,
            "locked_bytes": memory.locked_bytes, "baseline_bytes": job.baseline_bytes,
            "baseline_note": job.baseline_note,
            "terms": [{"label": i.label, "bytes": i.nbytes, "phase": i.phase, "locked": i.locked,
                       "on_device": i.on_device, "in_peak": i.phase in peak, "formula": i.formula}
                      for i in memory.items]}


def _memlock(env: LintEnv, pinned: int, what: str) -> CheckResult:
    name = "locked memory (ulimit -l)"
    data = {"locked_bytes": pinned, "memlock_bytes": env.memlock_bytes, "enforced": not env.can_lock_unlimited}
    if env.memlock_bytes is None:
        return CheckResult(name, "ok", f"unlimited; swap buffers lock {units.mib(pinned)} ({what})", data=data)
    if env.can_lock_unlimited:
        return CheckResult(name, "ok", f"ulimit -l {units.mib(env.memlock_bytes)}, not enforced (CAP_IPC_LOCK); swap "
                           f"buffers lock {units.mib(pinned)}", data=data)
    if pinned > env.memlock_bytes:
        return CheckResult(name, "fail", f"swap buffers lock {units.mib(pinned)} ({what}), over ulimit -l "
                           f"{units.mib(env.memlock_bytes)}: pinning them fails", "raise the memlock limit for the "
                           "training user (ulimit -l unlimited; docker run --ulimit memlock=-1), or lower "
                           "buffer_count / buffer_size / sub_group_size", data=data)
    return CheckResult(name, "ok", f"swap buffers lock {units.mib(pinned)} of ulimit -l {units.mib(env.memlock_bytes)}",
                       data=data)


LOCK_WHAT = ("torch creates this lock while it compiles DeepSpeed's {op} op on first use and removes it when the "
             "build ends; ")


def check_lock(lock: oplocks.BuildLock) -> CheckResult:
    name = f"op-build lock ({lock.op})"
    age = f"{lock.age_s / 60:.0f} min old"
    what = LOCK_WHAT.format(op=lock.op)
    data = {"path": lock.path, "age_s": lock.age_s, "holders": list(lock.holders), "builders": list(lock.builders),
            "stale_after_s": oplocks.STALE_LOCK_AFTER_S}
    if not lock.orphaned:
        pid = (lock.builders or lock.holders)[0]
        return CheckResult(name, "warn", f"{lock.path}: {age}, held by pid {pid} ({jobfacts.command_of(pid)}): "
                           f"{what}a job loading {lock.op} waits until it is done",
                           "let the build finish; jobs wait for it", data=data)
    if lock.stale:
        return CheckResult(name, "fail", f"{lock.path}: {age}, no build running: {what}a killed build left it, "
                           f"and every load of {lock.op} waits on it forever, silently",
                           f"rm {lock.path}", fixable=True, target=lock.path, data=data)
    return CheckResult(name, "warn", f"{lock.path}: {age}, no process here holds it or builds under it: {what}"
                       f"a build killed midway leaves it, and every load of {lock.op} then waits on it forever, "
                       f"silently (or a build on another machine sharing this directory holds it)",
                       f"rm {lock.path} if no build elsewhere shares this directory (after "
                       f"{oplocks.STALE_LOCK_AFTER_S / 60:.0f} min, --fix does)", data=data)
