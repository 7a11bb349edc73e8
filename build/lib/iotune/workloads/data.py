"""Synthetic packed token blocks with learnable structure.

No dataset is downloaded. Blocks use an alphabet of
ALPHABET symbols spread evenly over the vocabulary; each block follows an
affine recurrence s[i+1] = (a * s[i] + b) mod ALPHABET from a random start,
with (a, b) drawn from a small fixed set of rules. Next-token prediction is
learnable at two speeds (the alphabet within a few steps, the rules over
tens), so the loss falls from ln(vocab) on every strategy within the few steps
a CI run takes, yet every step sees new blocks, as in packed-text training.
The stream is a pure function of the seed.
"""

from __future__ import annotations

from typing import Any

RULES = ((5, 3), (7, 11), (3, 1), (9, 5))
ALPHABET = 64


def token_blocks(batch: int, seq_len: int, vocab: int, seed: int, step: int) -> Any:
    """A (batch, seq_len) LongTensor for micro-step `step`."""
    import torch

    g = torch.Generator().manual_seed(seed * 1_000_003 + step)
    alphabet = min(ALPHABET, vocab)
    start = torch.randint(0, alphabet, (batch,), generator=g)
    rule = torch.randint(0, len(RULES), (batch,), generator=g)
    a = torch.tensor([RULES[int(r)][0] for r in rule])
    b = torch.tensor([RULES[int(r)][1] for r in rule])
    out = torch.empty((batch, seq_len), dtype=torch.long)
    out[:, 0] = start
    for i in range(1, seq_len):
        out[:, i] = (a * out[:, i - 1] + b) % alphabet
    return out * (vocab // alphabet)
