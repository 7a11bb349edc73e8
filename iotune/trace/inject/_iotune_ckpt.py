"""Checkpoint I/O for `iotune trace` and the checkpoint sweep, inside the job.

Stdlib only, like _iotune_hooks (which installs this): torch is imported
only when the sweep asks this hook to save, restore or replay (below).

- Calls: DeepSpeedEngine.save_checkpoint and .load_checkpoint each append,
  when they return, {"k": "ckcall", "op": "save"|"load", "dir": <dir>/<tag>,
  "s", "t0", "t1", "files": [[path, bytes, dirty, writeback], ...],
  "mem": bytes, "loaded": bool, "raised": "<exception>"}. raised: what the
  call raised, if it did (loaded is then absent). files: every file of the
  checkpoint (the tag directory, and `latest` and the recovery scripts
  beside it) with the bytes still in the page cache unwritten (dirty) or
  being written (writeback) at that moment, from the cachestat system call
  (Linux 6.5+; null where the kernel has none); mem: /proc/meminfo Dirty +
  Writeback then (the whole machine).
- Parts: each checkpoint engine's save or load of a file, the copytree of
  the offloaded tensors, the recovery scripts, the decoupled writer's
  hand-off and commit append {"k": "ckio", "w": what, "p": path, "t0",
  "t1"}. The decoupled writer's subprocess runs this hook too, so its own
  file writes appear in its own events file, with its own pid, and are
  matched to their checkpoint by path.
- Losses: with IOTUNE_LOSSES=1, every DeepSpeedEngine.backward(loss)
  appends {"k": "loss", "s": step, "v": float(loss)} (exact: JSON floats
  round-trip).

Driving a user's job (the checkpoint sweep; nothing happens without these):

- IOTUNE_CKPT_SAVE_AT=N and IOTUNE_CKPT_DIR=D: right after the N-th
  completed optimizer step, engine.save_checkpoint(D).
- IOTUNE_CKPT_LOAD=D: before the first forward, engine.load_checkpoint(D).
- IOTUNE_CKPT_CAPTURE=C with IOTUNE_CKPT_CAPTURE_COUNT=K: after the save,
  the inputs of the next K forward calls are saved (torch.save) as
  C/<i>.pt, each with the random number generators' states at that
  forward: torch's (CPU, and CUDA's when CUDA is initialised), Python's
  `random` and numpy's global one (when the job imported numpy).
  IOTUNE_CKPT_REPLAY=C: after the load, the next forward calls take those
  inputs instead of the job's own, in order, and each sets the generators
  to the states saved with its inputs right before it runs. A job whose
  data loader starts over when it restarts is then fed, after its restore,
  the very batches the uninterrupted run trained on next, and its dropout
  (any random draw from the forward on) draws what the uninterrupted run
  drew, wherever the job drew its data from before that forward.

IOTUNE_CPU_FAST_WRITER=1 (set by the checkpoint sweep for iotune's own
workload on the CPU accelerator only): a workaround that lets DeepSpeed
0.19.8's fast checkpoint writer run without an accelerator, for the
built-in workload. Stock DeepSpeed fails there twice: the writer pins its
I/O buffer with Tensor.pin_memory(), which needs an accelerator ("Cannot
access accelerator device when none is available"), and FastFileWriter
loads UtilsBuilder, which the CPU accelerator does not implement ("This op
had not been implemented on CPU backend"). The workaround skips the pinning
(an unpinned buffer goes through the aio handle's bounce buffer) and loads
DeepSpeed's generic UtilsBuilder (compiled on first use).
"""

import ctypes
import os
import random
import shutil
import sys
import time

_ctx = {"emit": None, "flush": None, "state": None, "call": None, "captured": 0, "replayed": 0, "loaded": False}
RECOVERY_SCRIPTS = ("zero_to_fp32.py", "zero_to_torch.py")
CACHESTAT = 451          # x86_64 and the generic syscall table


def bind(emit, state, flush=None):
    _ctx["emit"], _ctx["state"], _ctx["flush"] = emit, state, flush
    _patch_copytree()


def _emit(event):
    _ctx["emit"](event)


def _io(what, path, t0):
    _emit({"k": "ckio", "w": what, "p": str(path), "t0": t0, "t1": time.monotonic_ns()})


# -- the calls ----------------------------------------------------------------------

def wrap_calls(cls):
    """Wrap save_checkpoint and load_checkpoint (already timed as phases)."""
    for method, op in (("save_checkpoint", "save"), ("load_checkpoint", "load")):
        if hasattr(cls, method):
            _wrap_call(cls, method, op)
    if hasattr(cls, "_copy_recovery_script"):
        orig = cls._copy_recovery_script

        def scripts(self, save_path, *args, **kwargs):
            t0 = time.monotonic_ns()
            try:
                return orig(self, save_path, *args, **kwargs)
            finally:
                _io("scripts", os.path.join(str(save_path), RECOVERY_SCRIPTS[0]), t0)

        scripts.__wrapped__ = orig
        cls._copy_recovery_script = scripts


def _wrap_call(cls, method, op):
    orig = getattr(cls, method)

    def wrapper(self, directory, *args, **kwargs):
        tag = args[0] if args else kwargs.get("tag")
        tag = str(tag) if tag is not None else _default_tag(self, op, str(directory))
        outer, t0 = _ctx["call"], time.monotonic_ns()
        _ctx["call"] = op
        result, raised = None, None
        try:
            result = orig(self, directory, *args, **kwargs)
            return result
        except BaseException as e:
            raised = f"{type(e).__name__}: {e}"[:500]
            raise
        finally:
            _ctx["call"] = outer
            _call_done(op, str(directory), tag, t0, result, raised)

    wrapper.__wrapped__ = orig
    wrapper.__name__ = method
    setattr(cls, method, wrapper)


def _default_tag(engine, op, directory):
    if op == "save":
        return f"global_step{getattr(engine, 'global_steps', 0)}"
    try:
        with open(os.path.join(directory, "latest")) as fh:
            return fh.read().strip()
    except OSError:
        return ""


def _call_done(op, directory, tag, t0, result, raised):
    t1 = time.monotonic_ns()
    event = {"k": "ckcall", "op": op, "dir": os.path.join(directory, tag) if tag else directory,
             "s": _ctx["state"]["step"], "t0": t0, "t1": t1}
    if raised:
        event["raised"] = raised
    try:
        event["files"] = _files(directory, tag) if tag else []
        if op == "save":
            event["mem"] = _meminfo_dirty()
        elif not raised:
            event["loaded"] = bool(isinstance(result, tuple) and result and result[0] is not None)
    except Exception as e:  # noqa: BLE001 - attribution must never break the job
        event["hook_error"] = f"{type(e).__name__}: {e}"
    _emit(event)
    if _ctx["flush"] is not None:
        _ctx["flush"]()       # on disk when the call returns: a job may leave with os._exit right after its save


def _files(directory, tag):
    paths = []
    for root, _, names in os.walk(os.path.join(directory, tag)):
        paths += [os.path.join(root, n) for n in sorted(names)]
    paths += [p for p in (os.path.join(directory, n) for n in ("latest", *RECOVERY_SCRIPTS)) if os.path.isfile(p)]
    page = os.sysconf("SC_PAGE_SIZE")
    out = []
    for path in paths:
        try:
            size = os.stat(path).st_size
        except OSError:
            continue
        pages = _cachestat(path)
        out.append([path, size, None if pages is None else pages[0] * page,
                    None if pages is None else pages[1] * page])
    return out


class _Range(ctypes.Structure):
    _fields_ = [("off", ctypes.c_uint64), ("len", ctypes.c_uint64)]


class _Stat(ctypes.Structure):
    _fields_ = [(n, ctypes.c_uint64) for n in ("cache", "dirty", "writeback", "evicted", "recently_evicted")]


def _cachestat(path):
    """(dirty pages, writeback pages) of a file, or None without cachestat."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        whole, stat = _Range(0, 0), _Stat()
        if libc.syscall(CACHESTAT, fd, ctypes.byref(whole), ctypes.byref(stat), 0) != 0:
            return None
        return int(stat.dirty), int(stat.writeback)
    finally:
        os.close(fd)


def _meminfo_dirty():
    total = 0
    with open("/proc/meminfo") as fh:
        for line in fh:
            key, _, rest = line.partition(":")
            if key in ("Dirty", "Writeback"):
                total += int(rest.split()[0]) * 1024
    return total


# -- the parts ----------------------------------------------------------------------

def _wrap_io(cls, method, what, path_at):
    orig = getattr(cls, method)

    def wrapper(self, *args, **kwargs):
        t0 = time.monotonic_ns()
        try:
            return orig(self, *args, **kwargs)
        finally:
            try:
                _io(what, path_at(args, kwargs), t0)
            except Exception:  # noqa: BLE001
                pass

    wrapper.__wrapped__ = orig
    setattr(cls, method, wrapper)


def _save_path(args, kwargs):
    return args[1] if len(args) > 1 else kwargs.get("path")


def _load_path(args, kwargs):
    return args[0] if args else kwargs.get("path")


def _commit_path(args, kwargs):
    info = args[0] if args else kwargs.get("info")
    return os.path.join(str(info.save_dir), str(info.tag), "")


def patch_engine_module(module):
    """A checkpoint engine module: time its engines' saves, loads and commits."""
    for name in ("TorchCheckpointEngine", "FastCheckpointEngine", "DecoupledCheckpointEngine"):
        cls = getattr(module, name, None)
        if cls is None or getattr(cls, "_iotune_ckio", False):
            continue
        cls._iotune_ckio = True
        decoupled = name.startswith("Decoupled")
        if "save" in vars(cls):
            _wrap_io(cls, "save", "handoff" if decoupled else "save", _save_path)
        if "load" in vars(cls):
            _wrap_io(cls, "load", "load", _load_path)
        if decoupled and "commit" in vars(cls):
            _wrap_io(cls, "commit", "commit", _commit_path)


def _patch_copytree():
    orig = shutil.copytree
    if getattr(orig, "_iotune", False):
        return

    def copytree(src, dst, *args, **kwargs):
        op = _ctx["call"]
        if op is None:
            return orig(src, dst, *args, **kwargs)
        t0 = time.monotonic_ns()
        try:
            return orig(src, dst, *args, **kwargs)
        finally:
            _io("copy", os.path.join(str(dst if op == "save" else src), ""), t0)

    copytree._iotune = True
    copytree.__wrapped__ = orig
    shutil.copytree = copytree


# -- losses and driving a user's job --------------------------------------------------

def record_loss(args, kwargs):
    if os.environ.get("IOTUNE_LOSSES") != "1":
        return
    loss = args[0] if args else kwargs.get("loss")
    try:
        value = float(loss.detach().float().item())
    except Exception:  # noqa: BLE001
        return
    _emit({"k": "loss", "s": _ctx["state"]["step"], "v": value, "t": time.monotonic_ns()})


def after_step(engine, completed):
    """After the job's `completed`-th optimizer step (this process's count)."""
    save_at, directory = os.environ.get("IOTUNE_CKPT_SAVE_AT", ""), os.environ.get("IOTUNE_CKPT_DIR")
    if not directory or not save_at.isdigit() or int(save_at) != completed:
        return
    engine.save_checkpoint(directory)
    count = os.environ.get("IOTUNE_CKPT_CAPTURE_COUNT", "0")
    _ctx["captured"] = -int(count) if count.isdigit() else 0     # negative: inputs still to capture


def before_forward(engine, args, kwargs):
    """(args, kwargs) for the job's next forward call."""
    load = os.environ.get("IOTUNE_CKPT_LOAD")
    if load and not _ctx["loaded"]:
        _ctx["loaded"] = True
        engine.load_checkpoint(load)
    capture, replay = os.environ.get("IOTUNE_CKPT_CAPTURE"), os.environ.get("IOTUNE_CKPT_REPLAY")
    if capture and _ctx["captured"] < 0:
        index = int(os.environ.get("IOTUNE_CKPT_CAPTURE_COUNT", "0")) + _ctx["captured"]
        _ctx["captured"] += 1
        _guarded("capture", _capture, os.path.join(capture, f"{index}.pt"), args, kwargs)
    elif replay and _ctx["loaded"]:
        path = os.path.join(replay, f"{_ctx['replayed']}.pt")
        if os.path.isfile(path):
            _ctx["replayed"] += 1
            args, kwargs = _guarded("replay", _replay, path, args, kwargs) or (args, kwargs)
    return args, kwargs


def _guarded(what, fn, *args):
    """fn(*args), or None when it fails: the job goes on, and says why on stderr."""
    try:
        return fn(*args)
    except Exception as e:  # noqa: BLE001 - the hook must never break the job
        sys.stderr.write(f"iotune: checkpoint {what} of a forward's inputs failed: {type(e).__name__}: {e}\n")
        return None


def _capture(path, args, kwargs):
    import torch

    torch.save({"args": args, "kwargs": kwargs, "rng": _rng_state()}, path)


def _replay(path, args, kwargs):
    """The captured inputs, with the generators set as they were at that forward."""
    import torch

    saved = torch.load(path, weights_only=False)
    _set_rng(saved.get("rng") or {})
    return saved["args"], saved["kwargs"]


def _rng_state():
    """The states every random draw of a forward may come from: torch's
    (CPU, and CUDA's per device once CUDA is initialised), Python's random
    and numpy's global generator (when the job imported numpy)."""
    import torch

    state = {"python": random.getstate(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        state["numpy"] = numpy.random.get_state()
    return state


def _set_rng(state):
    import torch

    if "python" in state:
        random.setstate(state["python"])
    if "torch" in state:
        torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    numpy = sys.modules.get("numpy")
    if "numpy" in state and numpy is not None:
        numpy.random.set_state(state["numpy"])


# -- the CPU-accelerator workaround for the fast writer ------------------------------

def cpu_fast_writer():
    return os.environ.get("IOTUNE_CPU_FAST_WRITER") == "1"


def patch_writer_factory(module):
    """Skip Tensor.pin_memory() while the writer factory sets up its buffer."""
    cls = module.CheckpointWriterFactory
    orig = cls._setup_for_aio

    def _setup_for_aio(self, aio_config):
        import torch

        pin = torch.Tensor.pin_memory
        torch.Tensor.pin_memory = lambda tensor, *a, **k: tensor
        try:
            return orig(self, aio_config)
        finally:
            torch.Tensor.pin_memory = pin

    _setup_for_aio.__wrapped__ = orig
    cls._setup_for_aio = _setup_for_aio
    sys.stderr.write("iotune: fast checkpoint writer on the CPU accelerator: pinning skipped (workaround, see "
                     "iotune/trace/inject/_iotune_ckpt.py)\n")


def patch_fast_file_writer(module):
    """FastFileWriter's UtilsBuilder: DeepSpeed's generic one, which builds for CPU."""
    from deepspeed.ops.op_builder.utils import UtilsBuilder

    module.UtilsBuilder = UtilsBuilder
