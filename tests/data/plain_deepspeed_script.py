"""A plain DeepSpeed training script, written the way users write them, with
no knowledge of iotune: a small MLP regression trained with ZeRO-3 and the
optimizer state offloaded to NVMe. Used to check that `iotune trace`
attributes phases and swap I/O of scripts it did not write.

    python plain_deepspeed_script.py SWAP_DIR STEPS
"""

import os
import socket
import sys

import deepspeed
import torch

swap_dir, steps = sys.argv[1], int(sys.argv[2])
if "RANK" not in os.environ:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 1))
config = {
    "train_micro_batch_size_per_gpu": 8,
    "gradient_accumulation_steps": 2,
    "optimizer": {"type": "Adam", "params": {"lr": 1e-3}},
    "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "nvme", "nvme_path": swap_dir}},
}
engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
for step in range(steps):
    for micro in range(2):
        x = torch.randn(8, 512)
        loss = (engine(x) - x.sum(dim=1, keepdim=True) / 50).pow(2).mean()
        engine.backward(loss)
        engine.step()
    print(f"step {step} loss {loss.item():.4f}")
