"""Training workloads: DeepSpeed offload strategies on a Llama-style model.

torch, transformers and deepspeed are imported lazily (inside functions), so
the rest of iotune works without them.
"""
