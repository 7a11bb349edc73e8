"""Llama-style model shapes, from a tiny CI size to the 1B-16B sizes of
Xinnor's published offload benchmark (grouped-query attention, SwiGLU MLP).
`1b` and `3b` are Llama 3.2 1B and 3B (tied input and output embeddings:
1,235,814,400 and 3,212,749,824 parameters); `8b` is Llama 3.1 8B and `16b`
the same architecture scaled (untied). Parameter counts are exact for
transformers' LlamaForCausalLM (tests/project/test_upstream.py builds each on the meta
device)."""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import UsageError


@dataclass(frozen=True)
class ModelShape:
    vocab: int
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    seq_len: int
    tied: bool = False               # input and output embeddings share one tensor (Llama 3.2 1B/3B)

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    def param_count(self) -> int:
        """Parameters of LlamaForCausalLM, no biases."""
        kv = self.kv_heads * self.head_dim
        attn = self.hidden * self.hidden * 2 + self.hidden * kv * 2      # q, o, k, v
        mlp = 3 * self.hidden * self.intermediate                         # gate, up, down
        norms = 2 * self.hidden
        per_layer = attn + mlp + norms
        return self.vocab * self.hidden * (1 if self.tied else 2) + self.layers * per_layer + self.hidden

    def activation_bytes(self, micro_batch: int, seq_len: int, dtype_bytes: int = 2) -> int:
        """Activations of one micro-batch kept for the backward, without
        recomputation: per layer s b h (34 + 5 a s / h) bytes in 16-bit
        (Korthikanti et al. 2022, arXiv:2205.05198, scaled by the dtype), and
        the logits in the dtype plus their fp32 copy and gradient for the loss."""
        s, b, h = seq_len, micro_batch, self.hidden
        per_layer = s * b * h * (34 + 5 * self.heads * s // h) * dtype_bytes // 2
        return self.layers * per_layer + s * b * self.vocab * (dtype_bytes + 8)


PRESETS: dict[str, ModelShape] = {
    # CI sizes: a few M parameters, seconds per step on 2 CPU cores
    "tiny": ModelShape(vocab=1024, hidden=256, layers=4, heads=4, kv_heads=4, intermediate=688, seq_len=128),
    "small": ModelShape(vocab=1024, hidden=512, layers=4, heads=8, kv_heads=8, intermediate=1376, seq_len=128),
    "medium": ModelShape(vocab=4096, hidden=1024, layers=8, heads=16, kv_heads=8, intermediate=2752, seq_len=256),
    # benchmark size: every 2-D weight (1536 x 1536 and up, 9 MiB in fp32) exceeds an 8 MiB aio block, so up
    # to 8 MiB a larger block changes how the same bytes move, not which tensors move (a 16 MiB block keeps
    # the 1536 x 1536 gradients in RAM: the gain split says so)
    "wide": ModelShape(vocab=4096, hidden=1536, layers=1, heads=12, kv_heads=12, intermediate=4096, seq_len=128),
    # the sizes of Xinnor's published offload benchmark (need the hardware)
    "1b": ModelShape(vocab=128256, hidden=2048, layers=16, heads=32, kv_heads=8, intermediate=8192, seq_len=4096,
                     tied=True),
    "3b": ModelShape(vocab=128256, hidden=3072, layers=28, heads=24, kv_heads=8, intermediate=8192, seq_len=4096,
                     tied=True),
    "8b": ModelShape(vocab=128256, hidden=4096, layers=32, heads=32, kv_heads=8, intermediate=14336, seq_len=4096),
    "16b": ModelShape(vocab=128256, hidden=5120, layers=44, heads=40, kv_heads=8, intermediate=17408, seq_len=4096),
}


def tensor_numels(shape: ModelShape) -> list[int]:
    """Element counts of every parameter tensor of LlamaForCausalLM, in
    model.parameters() order (a tied output embedding is the input one)."""
    h, kv = shape.hidden, shape.kv_heads * shape.head_dim
    layer = [h * h, kv * h, kv * h, h * h, shape.intermediate * h, shape.intermediate * h,
             h * shape.intermediate, h, h]
    return [shape.vocab * h] + layer * shape.layers + [h] + ([] if shape.tied else [shape.vocab * h])


def swappable_params(shape: ModelShape, min_bytes: int = 1 << 20, element_bytes: int = 4) -> int:
    """Parameters in tensors DeepSpeed's swapper moves: at least `min_bytes`
    (max(1 MiB, aio.block_size)) in the swap dtype (fp32 gradients: 4 B)."""
    return sum(n for n in tensor_numels(shape) if n * element_bytes >= min_bytes)


def get_preset(name: str) -> ModelShape:
    """The preset called `name`; UsageError naming the choices otherwise."""
    if name not in PRESETS:
        raise UsageError(f"unknown --model '{name}': choose one of {', '.join(PRESETS)}")
    return PRESETS[name]
