"""Records DeepSpeed training phases and swap I/O for `iotune trace`.

Stdlib only: this runs inside the traced job, whichever Python it uses.

- Phases: DeepSpeedEngine.forward, .backward, .step, .save_checkpoint and
  .load_checkpoint ("restore") are wrapped; each call appends {"k": "phase", "n": name, "s": step, "t0", "t1"}
  with CLOCK_MONOTONIC nanoseconds (the clock the block probe uses). Steps
  are numbered from 0 by counting .step() calls against the engine's
  gradient_accumulation_steps(); the call that completes a step is the
  "optimizer" phase, the others are "accumulate".
- Swap I/O: deepspeed.runtime.swap_tensor.utils.swap_in_tensors and
  swap_out_tensors (every ZeRO-Infinity swapper goes through them) are
  wrapped; each tensor appends {"k": "swap", "d": "r"|"w", "p": path,
  "b": bytes, "s": step, "n": phase, "t": ns}.

- Waits on swap I/O: the aio handles DeepSpeed's swappers make
  (partitioned and pipelined optimizer swappers, the parameter swapper) are
  wrapped so each wait() appends {"k": "wait", "s": step, "n": phase, "t0",
  "t1"}: the time the training thread is blocked on its swaps, the I/O
  stall not hidden behind compute. Each such handle, when made, appends
  {"k": "aio", "block_size", "queue_depth", "single_submit",
  "overlap_events", "intra_op_parallelism", "t"}: the job's own aio
  settings, as the handle reports them (a replay of its swap I/O runs at
  them too).

- Checkpoints: the parts of every save and load, the files a save leaves
  and what of them is not yet durable, and the sweep's save, restore and
  replay of a user's job: see _iotune_ckpt.py.

Memory: after every completed optimizer step, and at the interpreter's
exit in a process that reported anything, {"k": "mem", "s", "lck", "rss",
"hwm", "at": "step"|"exit"} (VmLck, VmRSS and VmHWM in bytes).

Events go to IOTUNE_EVENTS_DIR/events-<pid>.jsonl, buffered and flushed at
the end of every phase, after every checkpoint save or load, at exit and on
SIGTERM (when the job has not set its own handler: the hook then flushes and
lets SIGTERM end the process as it would have). A job that leaves with
os._exit right after its last save (as DeepSpeed jobs do to dodge aio
threads aborting a normal exit), or is killed there, keeps that save. Timing only: no synchronisation is added,
so on a GPU, phase times are host-side (kernel launch) times. The first line
of each file is {"k": "proc", "pid", "rank", "argv", "omp", "node"} (omp: the
process's OMP_NUM_THREADS, null when unset; node: "<host name> <mount
namespace>", by which a multi-node trace's agent on each node claims its
node's files when nodes share the events directory, as on the one-machine
bed: iotune.trace.agent.node_identity computes the same).

Shape (`iotune sweep offload`): deepspeed.initialize is wrapped so that
its first call appends {"k": "shape", "numels", "world", "micro": 0, "at":
"initialize", "dtype", "rss", "hwm", "params"} before DeepSpeed allocates
anything (each parameter's full element count, ds_numel under
deepspeed.zero.Init; dtype: the one ZeRO-3 will partition the parameters in;
rss and hwm: the process's VmRSS and VmHWM at that moment, and params the
bytes of host memory its parameters' storages hold then, from which iotune
takes the job's own baseline: see _parameter_storage_bytes). With
IOTUNE_SHAPE_ONLY=1 the process then leaves (SystemExit(0)): the sweep
learns the model's tensors without building the optimizer, whose buffers
alone may not fit the host.

Stopping (`iotune sweep --steps-cmd`): with IOTUNE_MAX_STEPS=N, the process
raises SystemExit(0) from DeepSpeedEngine.step() right after its N-th
completed optimizer step, once that step's event is on disk. Every rank
counts its own steps and they step in lockstep, so all ranks leave after the
same step and a launcher sees a clean exit; the job's own cleanup (finally,
atexit) still runs. Without the variable nothing is ever stopped.
"""

import atexit
import importlib.abc
import importlib.util
import json
import os
import signal
import sys
import threading
import time

import _iotune_ckpt

_lock = threading.Lock()
_state = {"step": 0, "phase": "", "out": None, "optimizer_steps": 0}

ENGINE = "deepspeed.runtime.engine"
SWAP_UTILS = "deepspeed.runtime.swap_tensor.utils"


def _out():
    """The event file, opened on first use (call with _lock held)."""
    if _state["out"] is None:
        path = os.path.join(os.environ["IOTUNE_EVENTS_DIR"], f"events-{os.getpid()}.jsonl")
        out = open(path, "a", buffering=1 << 16)
        proc = {"k": "proc", "pid": os.getpid(), "rank": _rank(), "argv": sys.argv[:8],
                "omp": os.environ.get("OMP_NUM_THREADS"), "node": _node()}
        out.write(json.dumps(proc, separators=(",", ":")) + "\n")
        _state["out"] = out
        atexit.register(_flush)
    return _state["out"]


def _rank():
    """The global rank: RANK (DeepSpeed's and torch's launchers), else
    SLURM_PROCID (a task started by srun, e.g. DeepSpeed's --launcher slurm,
    before the script sets RANK from it)."""
    for name in ("RANK", "SLURM_PROCID"):
        value = os.environ.get(name, "")
        if value.isdigit():
            return int(value)
    return 0


def _node():
    try:
        return f"{os.uname().nodename} {os.readlink('/proc/self/ns/mnt')}"
    except OSError:
        return os.uname().nodename


def _emit(event):
    line = json.dumps(event, separators=(",", ":")) + "\n"
    with _lock:
        _out().write(line)


def _flush():
    with _lock:
        if _state["out"] is not None:
            _state["out"].flush()


def _on_sigterm(signum, frame):
    """SIGTERM's default, after the buffered events are written. A signal
    that lands while this thread holds the lock (mid-write) cannot take it:
    then the write in progress is left alone and what was buffered before
    is flushed without it."""
    if _lock.acquire(blocking=False):
        try:
            if _state["out"] is not None:
                _state["out"].flush()
        except (OSError, RuntimeError, ValueError):
            pass
        finally:
            _lock.release()
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGTERM)


def _flush_on_sigterm():
    """Only where SIGTERM still has its default action and this is the main
    thread: a job's own handler is never replaced."""
    try:
        if threading.current_thread() is threading.main_thread() and \
                signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
            signal.signal(signal.SIGTERM, _on_sigterm)
    except (ValueError, OSError):
        pass


def _wrap_phase(cls, method, name):
    orig = getattr(cls, method)

    def wrapper(self, *args, **kwargs):
        if name == "forward" and not _state["phase"]:
            args, kwargs = _iotune_ckpt.before_forward(self, args, kwargs)
        elif name == "backward":
            _iotune_ckpt.record_loss(args, kwargs)
        # steps are counted here, from .step() calls and the configured
        # gradient accumulation, not from engine.global_steps: ZenFlow, for
        # one, advances that on its own schedule
        calls = getattr(self, "_iotune_step_calls", 0)
        if not getattr(self, "_iotune_shape_said", False):
            self._iotune_shape_said = True
            _emit_shape(self)
        gas = _accumulation_steps(self)
        step, phase = calls // gas, name
        if name == "optimizer":
            phase = "optimizer" if calls % gas == gas - 1 else "accumulate"
            self._iotune_step_calls = calls + 1
        outer = _state["phase"]
        _state["step"], _state["phase"] = step, phase
        t0 = time.monotonic_ns()
        try:
            result = orig(self, *args, **kwargs)
        finally:
            _emit({"k": "phase", "n": phase, "s": step, "t0": t0, "t1": time.monotonic_ns()})
            _state["phase"] = outer
            if not outer:
                _flush()
        if phase == "optimizer" and not outer:
            _emit_memory(step)
            _iotune_ckpt.after_step(self, _state["optimizer_steps"] + 1)
            _count_step()
        return result

    wrapper.__wrapped__ = orig
    wrapper.__name__ = getattr(orig, "__name__", method)
    wrapper.__doc__ = getattr(orig, "__doc__", None)
    setattr(cls, method, wrapper)


def _emit_shape(engine):
    """Once per engine: every parameter tensor's full element count, in
    model order (ZeRO-3 keeps it in ds_numel), and the data-parallel size and
    micro-batch, so iotune can model what this job's offload swaps and locks."""
    try:
        numels = _model_numels(engine.module)
        world = int(engine.dp_world_size) if hasattr(engine, "dp_world_size") else 1
        micro = int(engine.train_micro_batch_size_per_gpu())
    except Exception:  # noqa: BLE001 - attribution must never break the job
        return
    _emit({"k": "shape", "numels": numels, "world": world, "micro": micro, "t": time.monotonic_ns()})


def _status_memory():
    """This process's VmLck, VmRSS and VmHWM from /proc/self/status, in
    bytes (None: unreadable)."""
    mem = {}
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                key, _, rest = line.partition(":")
                if key in ("VmLck", "VmRSS", "VmHWM"):
                    mem[key] = int(rest.split()[0]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return mem


def _emit_memory(step, at="step"):
    """After a completed optimizer step (and at exit): this process's locked
    memory (VmLck: DeepSpeed's swap buffers), RSS and peak RSS (VmHWM), in bytes."""
    mem = _status_memory()
    if mem is None:
        return
    _emit({"k": "mem", "s": step, "lck": mem.get("VmLck", 0), "rss": mem.get("VmRSS", 0),
           "hwm": mem.get("VmHWM", 0), "at": at, "t": time.monotonic_ns()})


def _memory_at_exit():
    """At the interpreter's exit, in a process that reported anything: its
    memory once more, so a job that fails before or between steps (an
    exception, a stop after its steps) still tells its peak (VmHWM). A kill
    (SIGKILL, the OOM killer) leaves no such sample."""
    try:
        if _state["out"] is not None:
            _emit_memory(_state["step"], "exit")
            _flush()
    except Exception:  # noqa: BLE001 - never break the job's exit
        pass


def _max_steps():
    try:
        return int(os.environ.get("IOTUNE_MAX_STEPS", "0"))
    except ValueError:
        return 0


def _count_step():
    """After the IOTUNE_MAX_STEPS-th optimizer step: leave the job cleanly."""
    _state["optimizer_steps"] += 1
    limit = _max_steps()
    if limit > 0 and _state["optimizer_steps"] >= limit:
        _emit({"k": "stop", "steps": _state["optimizer_steps"], "t": time.monotonic_ns()})
        _flush()
        raise SystemExit(0)


def _accumulation_steps(engine):
    """Micro-steps per step as the user configured them. ZenFlow overwrites
    the engine's value with its update_interval, so the user's config wins."""
    try:
        configured = engine._config._param_dict.get("gradient_accumulation_steps")
        if isinstance(configured, int) and configured > 0:
            return configured
        return max(1, int(engine.gradient_accumulation_steps()))
    except Exception:  # noqa: BLE001
        return 1


def _patch_engine(module):
    cls = module.DeepSpeedEngine
    for method, name in (("forward", "forward"), ("backward", "backward"), ("step", "optimizer"),
                         ("save_checkpoint", "checkpoint"), ("load_checkpoint", "restore")):
        if hasattr(cls, method):
            _wrap_phase(cls, method, name)
    _iotune_ckpt.wrap_calls(cls)


def _wrap_swap(module, func, direction):
    orig = getattr(module, func)

    def wrapper(handle, buffers, paths, *args, **kwargs):
        t = time.monotonic_ns()
        result = orig(handle, buffers, paths, *args, **kwargs)
        for buf, path in zip(buffers, paths):
            try:
                nbytes = int(buf.numel()) * int(buf.element_size())
            except Exception:  # noqa: BLE001
                nbytes = -1
            _emit({"k": "swap", "d": direction, "p": str(path), "b": nbytes,
                   "s": _state["step"], "n": _state["phase"], "t": t})
        return result

    wrapper.__wrapped__ = orig
    setattr(module, func, wrapper)


def _model_numels(model):
    return [int(getattr(p, "ds_numel", 0) or p.numel()) for p in model.parameters()]


DTYPES = {"torch.float32": "fp32", "torch.bfloat16": "bf16", "torch.float16": "fp16"}


def _partition_dtype(model, precision, fp16_supported):
    """The dtype ZeRO-3 partitions the parameters in: theirs when the model
    was built under deepspeed.zero.Init; else DeepSpeed 0.19.8's engine
    first casts the model to the config's half precision (`precision`:
    "bf16", "fp16", or None to keep the model's dtype), then
    partition_parameters.Init._set_dtype keeps that dtype where the
    accelerator supports fp16 and takes bf16 where it does not (the CPU
    accelerator on a CPU without AVX512-FP16 or AMX-FP16, as torch's mkldnn
    reports: an fp32 model is then partitioned in bf16)."""
    first = next(iter(model.parameters()), None)
    if first is None:
        return None
    if hasattr(first, "ds_tensor"):
        return DTYPES.get(str(first.ds_tensor.dtype))
    if not fp16_supported():
        return "bf16"
    return precision or DTYPES.get(str(first.dtype))


def _fp16_supported():
    from deepspeed.accelerator import get_accelerator

    return bool(get_accelerator().is_fp16_supported())


def _config_precision(args, kwargs):
    """The half precision the config deepspeed.initialize was given enables
    ("bf16", "fp16"; None for neither, or a config it cannot read), found
    where initialize looks: config, config_params, args.deepspeed_config."""
    config = kwargs.get("config", kwargs.get("config_params"))
    if config is None:
        ns = kwargs.get("args", args[0] if args else None)
        config = getattr(ns, "deepspeed_config", None) or getattr(ns, "deepscale_config", None)
    if isinstance(config, (str, os.PathLike)):
        try:
            with open(config) as fh:
                config = json.load(fh)
        except (OSError, ValueError):
            return None
    if not isinstance(config, dict):
        return None
    for key, name in (("bf16", "bf16"), ("bfloat16", "bf16"), ("fp16", "fp16")):
        section = config.get(key)
        if isinstance(section, dict) and section.get("enabled") is True:
            return name
    return None


def _parameter_storage_bytes(model):
    """Bytes of host memory the model's parameters hold right now: every
    distinct storage (counted once: tied weights share one) behind a
    parameter's data and, under ZeRO-3, its partition (ds_tensor; the data
    itself is then an empty placeholder), on the CPU only (a GPU's memory is
    not the process's RSS). The host-memory model counts the parameters DeepSpeed
    keeps as items of their own, so the baseline leaves these out."""
    seen = {}
    for p in model.parameters():
        for t in (p, getattr(p, "ds_tensor", None)):
            if t is None or t.device.type != "cpu":
                continue
            storage = t.untyped_storage()
            if storage.nbytes():
                seen[storage.data_ptr()] = storage.nbytes()
    return sum(seen.values())


def _startup_memory(model):
    """What the process holds as it calls deepspeed.initialize, for the
    baseline of iotune's host-memory model: "rss" (VmRSS), "hwm" (VmHWM,
    its peak so far) and "params" (_parameter_storage_bytes), in bytes; {}
    when any is unreadable (the shape is reported all the same)."""
    try:
        mem = _status_memory()
        if not mem or "VmRSS" not in mem:
            return {}
        return {"rss": mem["VmRSS"], "hwm": mem.get("VmHWM", mem["VmRSS"]),
                "params": _parameter_storage_bytes(model)}
    except Exception:  # noqa: BLE001 - attribution must never break the job
        return {}


def _patch_initialize(module):
    orig = module.initialize

    def initialize(*args, **kwargs):
        if not _state.get("shape_at_init"):
            _state["shape_at_init"] = True
            model = kwargs.get("model", args[1] if len(args) > 1 else None)
            try:
                numels = _model_numels(model) if model is not None else None
                dtype = (_partition_dtype(model, _config_precision(args, kwargs), _fp16_supported)
                         if model is not None else None)
            except Exception:  # noqa: BLE001 - attribution must never break the job
                numels, dtype = None, None
            if numels is not None:
                world = os.environ.get("WORLD_SIZE", "1")
                _emit({"k": "shape", "numels": numels, "world": int(world) if world.isdigit() else 1,
                       "micro": 0, "at": "initialize", "dtype": dtype, **_startup_memory(model),
                       "t": time.monotonic_ns()})
            if os.environ.get("IOTUNE_SHAPE_ONLY") == "1":
                _emit({"k": "stop", "steps": 0, "t": time.monotonic_ns()})
                _flush()
                raise SystemExit(0)
        return orig(*args, **kwargs)

    initialize.__wrapped__ = orig
    module.initialize = initialize


def _patch_swap_utils(module):
    _wrap_swap(module, "swap_in_tensors", "r")
    _wrap_swap(module, "swap_out_tensors", "w")


def _timed_handles(op):
    """Make the loaded async_io op's aio_handle a subclass whose wait() is
    timed. The handles stay DeepSpeed's own objects (no proxy in between:
    their lifetime and teardown are unchanged); done once per process."""
    base = op.aio_handle
    if getattr(base, "_iotune_timed", False):
        return op

    class aio_handle(base):  # noqa: N801 - stands in for the op's own name
        _iotune_timed = True

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            _emit_aio(self)

        def wait(self, *args, **kwargs):
            t0 = time.monotonic_ns()
            try:
                return super().wait(*args, **kwargs)
            finally:
                _emit({"k": "wait", "s": _state["step"], "n": _state["phase"], "t0": t0,
                       "t1": time.monotonic_ns()})

    op.aio_handle = aio_handle
    return op


def _emit_aio(handle):
    """The settings a swapper's handle was made with, as the handle reports them."""
    try:
        event = {"k": "aio", "block_size": int(handle.get_block_size()), "queue_depth": int(handle.get_queue_depth()),
                 "single_submit": bool(handle.get_single_submit()),
                 "overlap_events": bool(handle.get_overlap_events()),
                 "intra_op_parallelism": int(handle.get_intra_op_parallelism()), "t": time.monotonic_ns()}
    except Exception:  # noqa: BLE001 - attribution must never break the job
        return
    _emit(event)


def _patch_swapper(module):
    builder = getattr(module, "AsyncIOBuilder", None)
    if builder is None:
        return

    class AsyncIOBuilder(builder):
        def load(self, *args, **kwargs):
            op = super().load(*args, **kwargs)
            try:
                return _timed_handles(op)
            except Exception as e:  # noqa: BLE001 - never break the job: it runs untimed
                sys.stderr.write(f"iotune: cannot time the aio handles' waits ({e})\n")
                return op

    module.AsyncIOBuilder = AsyncIOBuilder


SWAPPERS = ("deepspeed.runtime.swap_tensor.partitioned_optimizer_swapper",
            "deepspeed.runtime.swap_tensor.pipelined_optimizer_swapper",
            "deepspeed.runtime.swap_tensor.partitioned_param_swapper")
CKPT_ENGINES = ("deepspeed.runtime.checkpoint_engine.torch_checkpoint_engine",
                "deepspeed.runtime.checkpoint_engine.fast_checkpoint_engine",
                "deepspeed.runtime.checkpoint_engine.decoupled_checkpoint_engine")
PATCHES = {"deepspeed": _patch_initialize, ENGINE: _patch_engine, SWAP_UTILS: _patch_swap_utils,
           **{m: _patch_swapper for m in SWAPPERS}, **{m: _iotune_ckpt.patch_engine_module for m in CKPT_ENGINES}}
if _iotune_ckpt.cpu_fast_writer():
    PATCHES.update({"deepspeed.runtime.model_checkpointing.writer_factory": _iotune_ckpt.patch_writer_factory,
                    "deepspeed.io.fast_file_writer": _iotune_ckpt.patch_fast_file_writer})


class _Loader(importlib.abc.Loader):
    def __init__(self, inner, patch):
        self.inner, self.patch = inner, patch

    def create_module(self, spec):
        return self.inner.create_module(spec)

    def __getattr__(self, attr):   # get_source, get_filename, ... for inspect and friends
        return getattr(self.inner, attr)

    def exec_module(self, module):
        self.inner.exec_module(module)
        try:
            self.patch(module)
        except Exception as e:  # noqa: BLE001 - never break the job
            sys.stderr.write(f"iotune: could not instrument {module.__name__} ({e})\n")


class _Finder(importlib.abc.MetaPathFinder):
    """Patches DeepSpeed's modules (PATCHES) right after they execute,
    before any other module imports names from them."""

    def find_spec(self, name, path, target=None):
        patch = PATCHES.get(name)
        if patch is None:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None and spec.loader is not None:
                spec.loader = _Loader(spec.loader, patch)
                return spec
        return None


def install():
    _iotune_ckpt.bind(_emit, _state, _flush)
    _flush_on_sigterm()
    atexit.register(_memory_at_exit)
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())
    os.makedirs(os.environ["IOTUNE_EVENTS_DIR"], exist_ok=True)
