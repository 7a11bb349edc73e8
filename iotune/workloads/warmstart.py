"""Warm starts for the built-in workload: fork a ready process, don't exec a new one.

A run of the built-in workload spends ~15 of its ~20 s starting: importing
torch, transformers and DeepSpeed (whose ZeRO optimizer check imports modules
that call torch.compile), and loading DeepSpeed's C++ ops. A sweep's
confirmation starts a dozen such runs. The warm starter pays that once: a
server process (`python -m iotune.workloads.warmstart`) imports all of it, then
forks one child per run. Each child is a fresh process (own session, own
cgroup, own environment, the run's stdout/stderr) that runs
`iotune.workloads.train` (or DeepSpeed's check of the recommended config,
`iotune.sweep.ds_check`) with the run's arguments and exits; nothing of one
run reaches the next, and the server itself never trains (no torch thread
pool exists in it when it forks).

The client (WarmStarter) talks to the server over a socketpair: one request
(argv, environment, cwd, cgroup, and the two pipe ends for stdout/stderr)
per run, answered with the child's pid and then its exit status. On a time
limit or an interruption the client kills the child's whole session, as
`run_in_own_group` does for an exec'd run. When the server cannot start or
dies, the client says so and the caller runs the workload the ordinary way.
"""

from __future__ import annotations

import importlib
import json
import os
import selectors
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any, NoReturn

from ..errors import WarmStartUnavailable
from ..host.cgroup import join_cgroup_preexec
from ..host.proc import WATCH_EVERY_S, kill_session, prefer_interpreter_tools

MAX_MESSAGE = 1 << 20
READY_TIMEOUT_S = 600.0          # a DeepSpeed without prebuilt ops may build them on the first start
# modules a run imports on the way (a module missing in another version is skipped)
WARM_MODULES = (
    "torch",
    "deepspeed",
    "transformers",
    "transformers.models.llama.modeling_llama",
    "deepspeed.runtime.engine",
    "deepspeed.runtime.zero.stage3",
    "deepspeed.runtime.zero.utils",
    "deepspeed.runtime.zero.muon.muon_optimizer",
    "deepspeed.ops.adam",
    "deepspeed.runtime.swap_tensor.partitioned_optimizer_swapper",
    "deepspeed.runtime.swap_tensor.pipelined_optimizer_swapper",
    "iotune.workloads.train",
)


TRAIN_MODULE = "iotune.workloads.train"
# what a child may run: the workload, and the check that DeepSpeed accepts a recommended aio config
# (its op is already loaded here, so the check takes a fraction of a second instead of a cold start)
RUNNABLE = (TRAIN_MODULE, "iotune.sweep.ds_check")


# ---- the server -------------------------------------------------------------

def warm_up() -> list[str]:
    """Import what a run imports and load DeepSpeed's ops (those prebuilt into
    the package through DeepSpeed's own loader, current JIT builds from
    torch's cache: fastops); the modules that could not be imported (older or
    newer versions). Forked runs inherit the loaded ops."""
    import importlib

    prefer_interpreter_tools()      # only a DeepSpeed without prebuilt ops builds, with this venv's ninja
    missing = []
    for name in WARM_MODULES:
        try:
            importlib.import_module(name)
        except ImportError:
            missing.append(name)
    from .fastops import preload_built_ops

    preload_built_ops()
    return missing


def _child(conn: socket.socket, request: dict[str, Any], fds: list[int]) -> None:
    """In the forked child: become the run's own process, run it, exit."""
    code = 1
    try:
        conn.close()
        os.setsid()
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        join = join_cgroup_preexec(request.get("cgroup"))
        if join is not None:
            join()
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(fds[0], 1)
        os.dup2(fds[1], 2)
        for fd in (null, *fds):
            os.close(fd)
        os.chdir(request.get("cwd") or "/")
        os.environ.clear()
        os.environ.update(request["env"])
        tempfile.tempdir = None               # the run's TMPDIR, not the one the server cached
        threads = os.environ.get("OMP_NUM_THREADS", "")
        if threads.isdigit() and int(threads) > 0:      # read at load time, so set it in the runtime
            import torch

            from .openmp import set_threads

            torch.set_num_threads(int(threads))
            set_threads(int(threads))
        module = request["module"]           # one of RUNNABLE: the client checked it
        sys.argv = [module, *request["argv"]]
        code = importlib.import_module(module).main(request["argv"])
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    except BaseException:                  # noqa: BLE001 - the run's own traceback goes to its stderr
        import traceback

        traceback.print_exc()
        code = 1
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def serve(conn: socket.socket) -> None:
    """One run at a time, until the client closes its end."""
    while True:
        try:
            msg, fds, _, _ = socket.recv_fds(conn, MAX_MESSAGE, 2)
        except OSError:
            return
        if not msg:
            return
        request = json.loads(msg)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            _child(conn, request, fds)
        for fd in fds:
            os.close(fd)
        conn.send(json.dumps({"pid": pid}).encode())
        _, status = os.waitpid(pid, 0)
        conn.send(json.dumps({"returncode": os.waitstatus_to_exitcode(status)}).encode())


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    conn = socket.socket(fileno=int(args[0]))
    signal.signal(signal.SIGINT, signal.SIG_IGN)     # the client decides when this ends
    started = time.monotonic()
    missing = warm_up()
    conn.send(json.dumps({"ready": True, "warm_s": round(time.monotonic() - started, 3),
                          "missing": missing}).encode())
    serve(conn)
    return 0


# ---- the client -------------------------------------------------------------

class WarmStarter:
    """Runs `python -m iotune.workloads.train ARGV` as forks of a warm server.
    Start it once, run many times, close it (or use it as a context manager)."""

    def __init__(self, ready_timeout_s: float = READY_TIMEOUT_S) -> None:
        self.ready_timeout_s = ready_timeout_s
        self.server: subprocess.Popen[bytes] | None = None
        self.conn: socket.socket | None = None
        self.warm_s: float | None = None
        self._log: Any = None

    def __enter__(self) -> WarmStarter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self) -> None:
        if self.conn is not None:
            return
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._log = tempfile.TemporaryFile()
        env = dict(os.environ)
        env.setdefault("PYTHONWARNINGS", "ignore")
        try:
            self.server = subprocess.Popen(
                [sys.executable, "-W", "ignore", "-m", "iotune.workloads.warmstart", str(theirs.fileno())],
                pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL, stdout=self._log, stderr=self._log,
                start_new_session=True, env=env)
        finally:
            theirs.close()
        self.conn = ours
        reply = self._receive(self.ready_timeout_s)
        if not reply.get("ready"):
            self.close()
            raise WarmStartUnavailable(f"the warm-start server did not get ready: {reply}")
        self.warm_s = reply.get("warm_s")

    def _connection(self) -> socket.socket:
        if self.conn is None:
            self._fail("it is not running")
        return self.conn

    def _receive(self, timeout_s: float | None) -> dict[str, Any]:
        conn = self._connection()
        conn.settimeout(timeout_s)
        try:
            msg = conn.recv(MAX_MESSAGE)
        except (socket.timeout, OSError) as e:
            self._fail(f"no answer ({e})")
        if not msg:
            self._fail("it exited")
        return dict(json.loads(msg))

    def _fail(self, why: str) -> NoReturn:
        log = b""
        if self._log is not None:
            self._log.seek(0)
            log = self._log.read()[-2000:]
        self.close()
        tail = log.decode(errors="replace").strip().splitlines()
        raise WarmStartUnavailable(f"the warm-start server failed: {why}"
                                   + (f": {tail[-1]}" if tail else ""))

    @property
    def running(self) -> bool:
        """The server is up (started and not closed): a run costs no warm-up."""
        return self.conn is not None

    def run(self, argv: list[str], timeout_s: float | None, cgroup: str | os.PathLike[str] | None = None,
            env: dict[str, str] | None = None, module: str = TRAIN_MODULE,
            watch: Callable[[], None] | None = None) -> subprocess.CompletedProcess[str]:
        """Like run_in_own_group([python, -m, MODULE, *argv]) for a MODULE in
        RUNNABLE (the workload by default): stdout and stderr captured; on
        the time limit or any interruption the run's whole session is killed
        and reaped before the exception propagates (subprocess.TimeoutExpired
        on the limit, or what `watch`, called every WATCH_EVERY_S, raised)."""
        if module not in RUNNABLE:
            raise ValueError(f"the warm-start server runs only {', '.join(RUNNABLE)}, not {module}")
        self.start()
        conn = self._connection()
        request = {"module": module, "argv": list(argv), "env": dict(os.environ if env is None else env),
                   "cwd": os.getcwd(), "cgroup": os.fspath(cgroup) if cgroup else None}
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        try:
            socket.send_fds(conn, [json.dumps(request).encode()], [out_w, err_w])
        except OSError as e:
            for fd in (out_r, out_w, err_r, err_w):
                os.close(fd)
            self._fail(f"could not send the run ({e})")
        finally:
            for fd in (out_w, err_w):
                try:
                    os.close(fd)
                except OSError:
                    pass
        pid: int | None = None
        try:
            pid = int(self._receive(30.0)["pid"])
            out, err = _read_until_eof(out_r, err_r, timeout_s, watch)
            code = int(self._receive(60.0)["returncode"])
        except BaseException:
            if pid is not None:
                kill_session(pid)
                try:
                    self._receive(30.0)                   # the server reaps it
                except WarmStartUnavailable:
                    pass
            raise
        finally:
            os.close(out_r)
            os.close(err_r)
        cmd = [sys.executable, "-m", module, *argv]
        return subprocess.CompletedProcess(cmd, code, out, err)

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None
        if self.server is not None:
            try:
                self.server.wait(timeout=10)
            except subprocess.TimeoutExpired:
                kill_session(self.server.pid)
                self.server.wait()
            self.server = None
        if self._log is not None:
            self._log.close()
            self._log = None


def _read_until_eof(out_fd: int, err_fd: int, timeout_s: float | None,
                    watch: Callable[[], None] | None = None) -> tuple[str, str]:
    """Both pipes to EOF (the run and everything it started closed them), or
    subprocess.TimeoutExpired after timeout_s; `watch` is called every
    WATCH_EVERY_S meanwhile (what it raises propagates)."""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    chunks: dict[int, list[bytes]] = {out_fd: [], err_fd: []}
    sel = selectors.DefaultSelector()
    for fd in chunks:
        sel.register(fd, selectors.EVENT_READ)
    try:
        while sel.get_map():
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise subprocess.TimeoutExpired("iotune.workloads.train", timeout_s or 0)
            if watch is not None:
                watch()
                left = WATCH_EVERY_S if left is None else min(left, WATCH_EVERY_S)
            for key, _ in sel.select(left):
                data = os.read(key.fd, 65536)
                if data:
                    chunks[int(key.fd)].append(data)
                else:
                    sel.unregister(key.fd)
    finally:
        sel.close()
    return (b"".join(chunks[out_fd]).decode(errors="replace"),
            b"".join(chunks[err_fd]).decode(errors="replace"))


if __name__ == "__main__":
    sys.exit(main())
