"""A GPT-2-shaped training job written the way users write them, with no
knowledge of iotune: transformers' GPT2LMHeadModel (tied embeddings, fp32
weights as built, not under deepspeed.zero.Init), random tokens, the
DeepSpeed config from the command line. The held-out job of iotune's
memory-model tests: none of its shapes is a built-in preset.

    python gpt_job.py --deepspeed_config ds_config.json [--steps N] [--width 512]
"""

import argparse
import json
import os
import socket

import deepspeed
import torch
from transformers import GPT2Config, GPT2LMHeadModel

parser = argparse.ArgumentParser()
parser.add_argument("--deepspeed_config", required=True)
parser.add_argument("--steps", type=int, default=1000)
parser.add_argument("--width", type=int, default=512)
parser.add_argument("--layers", type=int, default=2)
parser.add_argument("--local_rank", type=int, default=-1)
args = parser.parse_args()

if "RANK" not in os.environ:          # plain `python`, no launcher
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))

with open(args.deepspeed_config) as fh:
    config = json.load(fh)

torch.manual_seed(0)
model = GPT2LMHeadModel(GPT2Config(vocab_size=8000, n_positions=64, n_embd=args.width, n_layer=args.layers,
                                   n_head=8))
engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
micro = config["train_micro_batch_size_per_gpu"]
for step in range(args.steps):
    for _ in range(config.get("gradient_accumulation_steps", 1)):
        x = torch.randint(0, 8000, (micro, 64))
        loss = engine(input_ids=x, labels=x).loss
        engine.backward(loss)
        engine.step()
    print(f"step {step} loss {loss.item():.4f}", flush=True)
