"""A plain DeepSpeed training script, written the way users write them, with
no knowledge of iotune: a small MLP regression trained on CPU with the
DeepSpeed config given on the command line (ZeRO-3 with the optimizer
state offloaded to NVMe, in the tests). Used to check that
`iotune sweep --steps-cmd` closes the loop on a job it did not write.

    python plain_ds_train.py --deepspeed_config ds_config.json [--steps N]
"""

import argparse
import json
import os
import socket

import deepspeed
import torch

parser = argparse.ArgumentParser()
parser.add_argument("--deepspeed_config", required=True)
parser.add_argument("--steps", type=int, default=1000)
parser.add_argument("--local_rank", type=int, default=-1)
args = parser.parse_args()

if "RANK" not in os.environ:          # plain `python`, no launcher
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))

with open(args.deepspeed_config) as fh:
    config = json.load(fh)
print("aio settings:", json.dumps(config.get("aio", {}), sort_keys=True), flush=True)

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 1))
engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
accumulation = config.get("gradient_accumulation_steps", 1)
for step in range(args.steps):
    for micro in range(accumulation):
        x = torch.randn(config["train_micro_batch_size_per_gpu"], 512)
        loss = (engine(x) - x.sum(dim=1, keepdim=True) / 50).pow(2).mean()
        engine.backward(loss)
        engine.step()
    print(f"step {step} loss {loss.item():.4f}", flush=True)
