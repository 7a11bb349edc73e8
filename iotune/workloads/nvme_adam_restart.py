"""Does your DeepSpeed restore Adam after loading a ZeRO-3 checkpoint with
the optimizer offloaded to NVMe?

    python -m iotune.workloads.nvme_adam_restart [--dir DIR] [--offload cpu]

A small model trains 4 steps (ZeRO-3, fp32, Adam on NVMe, swapping to a
directory made in DIR, default the current one: it must take O_DIRECT, so
not tmpfs) and saves a checkpoint after step 2. A fresh process loads it
into a fresh engine, swapping to another directory, and trains steps 3 and
4 on the same batches. Step 3's loss depends only on the weights; step 4's
on the update step 3 made, that is on Adam's moments and step count. It
prints both runs' losses and "Adam state restored" or "Adam restarted after
the NVMe restore" (DeepSpeed 0.19.8: restarted). Exit 0 either way, 1 when
the weights differ (the check itself failed). --offload cpu runs the same
with the optimizer in RAM, whose restore keeps Adam's state: the control.

It needs only torch and DeepSpeed with its async_io op: copy it to check a
machine without iotune.
"""

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile

STEPS, SAVE_AT, WIDTH = 4, 2, 1024
# a faithful restore is not bit-exact on step 4: DeepSpeed's CPU Adam recomputes its bias
# corrections with pow() after a load, where the uninterrupted run multiplies them step by step
TOLERANCE = 1e-5


def train(workdir: str, resume: bool, offload: str) -> list:
    """This process's losses: steps 1-4 saving after step 2, or 3-4 after loading that checkpoint."""
    import deepspeed
    import torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(WIDTH, WIDTH), torch.nn.ReLU(), torch.nn.Linear(WIDTH, WIDTH))
    swap = tempfile.mkdtemp(prefix="swap-", dir=workdir)
    config = {"train_micro_batch_size_per_gpu": 4, "optimizer": {"type": "Adam", "params": {"lr": 1e-3}},
              "zero_optimization": {"stage": 3, "offload_optimizer": {"device": offload, "nvme_path": swap}}}
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    checkpoint = os.path.join(workdir, "checkpoint")
    if resume:
        engine.load_checkpoint(checkpoint)
    losses = []
    for step in range(SAVE_AT + 1 if resume else 1, STEPS + 1):
        x = torch.randn(4, WIDTH, generator=torch.Generator().manual_seed(step))      # step n's batch
        loss = ((engine(x) - x.flip(1)) ** 2).mean()
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
        if step == SAVE_AT and not resume:
            engine.save_checkpoint(checkpoint)
    return losses


def run(workdir: str, phase: str, offload: str) -> list:
    """The losses of a fresh process running `phase`."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(port)}
    p = subprocess.run([sys.executable, os.path.abspath(__file__), "--phase", phase, "--dir", workdir, "--offload",
                        offload], env=env, stdout=subprocess.PIPE, text=True)
    if p.returncode != 0:
        sys.exit(f"the {phase} run failed (exit {p.returncode}); its output is above")
    return json.loads(p.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", default=".", help="where to swap and save (removed after); not tmpfs")
    parser.add_argument("--offload", choices=("nvme", "cpu"), default="nvme", help="where the optimizer goes")
    parser.add_argument("--phase", choices=("train", "resume"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.phase:
        print(json.dumps(train(args.dir, args.phase == "resume", args.offload)))
        return 0
    workdir = tempfile.mkdtemp(prefix="nvme-adam-restart-", dir=args.dir)
    try:
        uninterrupted, resumed = run(workdir, "train", args.offload)[SAVE_AT:], run(workdir, "resume", args.offload)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print(f"losses of steps 3, 4: uninterrupted {uninterrupted}, after the restore {resumed}")
    if resumed[0] != uninterrupted[0]:
        print("the weights were not restored (step 3 differs): this check cannot tell about Adam")
        return 1
    same = abs(resumed[1] - uninterrupted[1]) <= TOLERANCE * abs(uninterrupted[1])
    print("Adam state restored" if same else f"Adam restarted after the {'NVMe ' if args.offload == 'nvme' else ''}"
                                             f"restore")
    return 0


if __name__ == "__main__":
    sys.exit(main())
