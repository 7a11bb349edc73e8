"""Parsing sizes and durations the user types. Sizes are binary: K, KiB and
k all mean 1024 bytes (as DeepSpeed's aio block_size does); decimal needs an
explicit kB/MB/GB."""

from __future__ import annotations

import re

_UNITS = {
    "": 1, "b": 1,
    "k": 1 << 10, "kib": 1 << 10, "m": 1 << 20, "mib": 1 << 20, "g": 1 << 30, "gib": 1 << 30,
    "t": 1 << 40, "tib": 1 << 40,
    "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
}


def parse_size(text: str) -> int:
    """'512K' -> 524288, '1MiB' -> 1048576, '4096' -> 4096, '1MB' -> 1000000.

    Raises ValueError with a message naming the accepted forms.
    """
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*", text)
    unit = m.group(2).lower() if m else ""
    if not m or unit not in _UNITS:
        raise ValueError(f"'{text}' is not a size: use bytes or a unit, e.g. 4096, 512K, 1MiB, 1MB")
    value = float(m.group(1)) * _UNITS[unit]
    if value != int(value):
        raise ValueError(f"'{text}' is not a whole number of bytes")
    return int(value)


def parse_rate(text: str) -> float:
    """Bytes per second: '200MB/s' -> 2e8, '2GiB/s' -> 2147483648, '0' -> 0.
    The '/s' is optional ('200MB' means 200 MB/s where a rate is asked for).

    Raises ValueError with a message naming the accepted forms.
    """
    body = text.strip()
    body = body[:-2] if body.lower().endswith("/s") else body
    try:
        return float(parse_size(body))
    except ValueError:
        raise ValueError(f"'{text}' is not a rate: use e.g. 3GB/s, 200MB/s (decimal) or 2GiB/s") \
            from None
