"""What one training process holds besides its model: torch, transformers
and DeepSpeed imported, DeepSpeed's ops loaded, the process group up and a
ZeRO-3 engine stepping a model too small to count (one 64 x 64 layer).
Measured once per machine and environment (a child process reports its
peak RSS, and its RSS right before deepspeed.initialize) and kept in
~/.cache/iotune, keyed by the interpreter and the versions. The
host-memory model (iotune.model.host_memory) counts it once per rank.

Two figures: `baseline_bytes`, the whole process at its peak (what `plan`,
`lint` and `doctor` count when they have no job to measure), and
`engine_bytes`, what deepspeed.initialize and the steps add to it (the
modules initialize imports, about 1,400 on DeepSpeed 0.19.8, and the
engine): `sweep offload` measures the job's own process at
deepspeed.initialize and adds this part, which the job has not reached yet.

    python -m iotune.workloads.baseline      # prints {"accelerator", "baseline_bytes", "engine_bytes"}
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from ..errors import IotuneError

CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "iotune"


@dataclass(frozen=True)
class Baseline:
    accelerator: str          # DeepSpeed's choice: cpu, cuda, ...
    baseline_bytes: int       # peak RSS of the process with everything loaded
    engine_bytes: int         # of it, what deepspeed.initialize and two steps added (peak - RSS before initialize)


def _key() -> str:
    from importlib.metadata import PackageNotFoundError, version

    parts = [sys.executable]
    for name in ("torch", "deepspeed", "transformers"):
        try:
            parts.append(f"{name}={version(name)}")
        except PackageNotFoundError:
            parts.append(f"{name}=none")
    return hashlib.sha1(" ".join(parts).encode()).hexdigest()[:12]


def measure_baseline(timeout_s: float = 300.0) -> Baseline:
    """The cached measurement, or a new one (a child process, seconds)."""
    path = CACHE / f"baseline2-{_key()}.json"      # baseline-*: before engine_bytes
    try:
        return Baseline(**json.loads(path.read_text()))
    except (OSError, ValueError, TypeError):
        pass
    try:
        proc = subprocess.run([sys.executable, "-W", "ignore", "-m", "iotune.workloads.baseline"],
                              capture_output=True, text=True, timeout=timeout_s)
        found = Baseline(**json.loads(proc.stdout.strip().splitlines()[-1]))
    except (OSError, subprocess.TimeoutExpired, IndexError, ValueError, TypeError) as e:
        raise IotuneError(f"could not measure what a process with torch and DeepSpeed holds ({type(e).__name__}); "
                          f"check that `{sys.executable} -c 'import deepspeed'` works") from None
    try:
        CACHE.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(asdict(found)) + "\n")
    except OSError:
        pass                      # measured again next time
    return found


TINY_CONFIG = {"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 3},
               "optimizer": {"type": "Adam", "params": {"lr": 1e-3, "torch_adam": True}}}


def _measure_here() -> Baseline:
    import deepspeed
    import torch
    import transformers  # noqa: F401 - what a training process imports
    from deepspeed.accelerator import get_accelerator

    from ..host.proc import process_memory
    from .fastops import preload_built_ops
    from .train import single_process_env

    preload_built_ops()
    single_process_env()
    before = process_memory().get("rss_bytes", 0)
    engine, _, _, _ = deepspeed.initialize(model=torch.nn.Linear(64, 64), config=TINY_CONFIG,
                                           model_parameters=None)
    for _ in range(2):
        engine.backward(engine(torch.ones(1, 64)).sum())
        engine.step()
    peak = process_memory().get("peak_rss_bytes", 0)
    return Baseline(str(get_accelerator()._name), peak, max(0, peak - before))


def main() -> int:
    sys.stdout.write(json.dumps(asdict(_measure_here())) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
