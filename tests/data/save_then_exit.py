"""A DeepSpeed job that saves a checkpoint after one step and then leaves
the way real jobs do when aio threads would abort a normal exit: with
os._exit(0) right after the save (--exit os_exit), or by waiting until it is
killed with SIGTERM (--exit sigterm; it prints "saved" first, so whoever
kills it knows the save returned). Written with no knowledge of iotune.

    python save_then_exit.py --save-dir DIR --exit os_exit|sigterm
"""

import argparse
import os
import signal
import socket

import deepspeed
import torch

parser = argparse.ArgumentParser()
parser.add_argument("--save-dir", required=True)
parser.add_argument("--exit", choices=("os_exit", "sigterm"), required=True)
args = parser.parse_args()

if "RANK" not in os.environ:          # plain `python`, no launcher
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
config = {"train_micro_batch_size_per_gpu": 4, "zero_optimization": {"stage": 0}}
engine, _, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)
x = torch.randn(4, 256)
engine.backward(engine(x).pow(2).mean())
engine.step()
engine.save_checkpoint(args.save_dir, tag="step1")
print("saved", flush=True)
if args.exit == "os_exit":
    os._exit(0)
while True:
    signal.pause()
