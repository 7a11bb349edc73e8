"""Synthetic packed token blocks with learnable structure.

No dataset is downloaded. Each block follows an affine recurrence
t[i+1] = (a * t[i] + b) mod vocab from a random start, with (a, b) drawn from
a small fixed set of rules: next-token prediction is learnable (loss falls
from ln(vocab) within tens of steps), yet every step sees new blocks, as in
packed-text training. The stream is a pure function of the seed.
"""

from __future__ import annotations

from typing import Any

RULES = ((5, 3), (7, 11), (3, 1), (9, 5))


def token_blocks(batch: int, seq_len: int, vocab: int, seed: int, step: int) -> Any:
    """A (batch, seq_len) LongTensor for micro-step `step`."""
    import torch

    g = torch.Generator().manual_seed(seed * 1_000_003 + step)
    start = torch.randint(0, vocab, (batch,), generator=g)
    rule = torch.randint(0, len(RULES), (batch,), generator=g)
    a = torch.tensor([RULES[int(r)][0] for r in rule])
    b = torch.tensor([RULES[int(r)][1] for r in rule])
    out = torch.empty((batch, seq_len), dtype=torch.long)
    out[:, 0] = start
    for i in range(1, seq_len):
        out[:, i] = (a * out[:, i - 1] + b) % vocab
    return out
