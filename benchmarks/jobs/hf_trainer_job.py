"""A Hugging Face Trainer job as users write them, with no knowledge of
iotune: a Llama-shaped model from its config (none of iotune's presets),
random tokens, the DeepSpeed config handed to TrainingArguments. Held out
for benchmarks/memory_model.py. Needs `accelerate` (iotune's environment
does not install it): --site DIR puts a directory that holds it first on
sys.path (the benchmark installs it there with `pip install --target`).

    python hf_trainer_job.py --deepspeed_config ds_config.json [--steps N] [--site DIR]
"""

import argparse
import json
import os
import socket
import sys
import tempfile

parser = argparse.ArgumentParser()
parser.add_argument("--deepspeed_config", required=True)
parser.add_argument("--steps", type=int, default=1000)
parser.add_argument("--site", default="")
args = parser.parse_args()
if args.site:
    sys.path.insert(0, args.site)

import torch  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments  # noqa: E402

if "RANK" not in os.environ:          # plain `python`, no launcher
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))

with open(args.deepspeed_config) as fh:
    config = json.load(fh)
SEQ, VOCAB = 96, 6000


class RandomTokens(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 100_000

    def __getitem__(self, i: int) -> dict:
        g = torch.Generator().manual_seed(i)
        x = torch.randint(0, VOCAB, (SEQ,), generator=g)
        return {"input_ids": x, "labels": x}


training = TrainingArguments(output_dir=tempfile.mkdtemp(prefix="hf-trainer-job-"), max_steps=args.steps,
                             per_device_train_batch_size=config["train_micro_batch_size_per_gpu"],
                             gradient_accumulation_steps=config.get("gradient_accumulation_steps", 1),
                             learning_rate=config.get("optimizer", {}).get("params", {}).get("lr", 1e-4),
                             weight_decay=config.get("optimizer", {}).get("params", {}).get("weight_decay", 0.0),
                             logging_steps=1, save_strategy="no", report_to=[],
                             deepspeed=args.deepspeed_config, bf16=bool(config.get("bf16", {}).get("enabled")),
                             dataloader_num_workers=0, use_cpu=True)
# built after TrainingArguments, so that ZeRO-3 builds it under deepspeed.zero.Init (HF's integration)
model = LlamaForCausalLM(LlamaConfig(vocab_size=VOCAB, hidden_size=384, intermediate_size=1024, num_hidden_layers=3,
                                     num_attention_heads=6, num_key_value_heads=2, max_position_embeddings=SEQ,
                                     use_cache=False))
Trainer(model=model, args=training, train_dataset=RandomTokens()).train()
