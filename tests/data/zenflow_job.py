"""A small ZenFlow job, for checking what DeepSpeed does with a config that
`iotune lint` judges: deepspeed.initialize on a two-layer MLP with the config
at argv[1], then argv[2] optimizer steps. The last line on stdout is
`ZENFLOW_OK N` or `ZENFLOW_FAILED at <where>: <exception>: <message>`.

    python zenflow_job.py ds_config.json 2
"""

import json
import os
import socket
import sys
import traceback

if "RANK" not in os.environ:          # plain `python`, no launcher
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))

import deepspeed  # noqa: E402
import torch  # noqa: E402

with open(sys.argv[1]) as fh:
    config = json.load(fh)
steps = int(sys.argv[2])
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 256))
where = "deepspeed.initialize"
try:
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    for step in range(1, steps + 1):
        where = f"step {step}"
        x = torch.randn(config.get("train_micro_batch_size_per_gpu", 4), 256)
        loss = engine(x).pow(2).mean()
        engine.backward(loss)
        engine.step()
except Exception as e:      # noqa: BLE001 - the failure is the result
    traceback.print_exc()
    print(f"ZENFLOW_FAILED at {where}: {type(e).__name__}: {e}", flush=True)
else:
    print(f"ZENFLOW_OK {steps}", flush=True)
