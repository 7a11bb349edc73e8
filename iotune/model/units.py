"""Sizes and rates: parsing what the user types, and printing numbers with
explicit units.

Parsing: sizes are binary (K, KiB and k all mean 1024 bytes, as DeepSpeed's
aio block_size does); decimal needs an explicit kB/MB/GB. Parameter counts
are decimal, written as model sizes are: 16B, 1.5B, 350M, 7e9.

Printing: throughput and volumes are decimal (MB/s, GB: 10**6, 10**9 bytes);
request, tensor and memory sizes are binary (KiB, MiB, GiB: 2**10, 2**20,
2**30), as block-layer tools print them. A missing value (None) prints "-".
"""

from __future__ import annotations

import re
from decimal import Decimal

_UNITS = {
    "": 1, "b": 1,
    "k": 1 << 10, "kib": 1 << 10, "m": 1 << 20, "mib": 1 << 20, "g": 1 << 30, "gib": 1 << 30,
    "t": 1 << 40, "tib": 1 << 40,
    "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
}
_BINARY = (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10))
_DECIMAL = (("TB", 10**12), ("GB", 10**9), ("MB", 10**6), ("kB", 10**3))


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


_COUNT_SUFFIXES = {"": 1, "k": 10**3, "m": 10**6, "b": 10**9, "t": 10**12}


def parse_count(text: str) -> int:
    """A parameter count as model sizes are written: '16B' -> 16_000_000_000,
    '1.5B', '350M', '7e9', '8000000000'. K, M, B and T (either case) are
    thousand, million, billion and trillion.

    Raises ValueError with a message naming the accepted forms.
    """
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?(?:[eE]\d+)?)\s*([A-Za-z]?)\s*", text)
    if m is None or m.group(2).lower() not in _COUNT_SUFFIXES:
        raise ValueError(f"'{text}' is not a parameter count: write it as 16B, 1.5B, 350M, 7e9 or 8000000000 "
                         f"(K, M, B, T: thousand, million, billion, trillion)")
    value = Decimal(m.group(1)) * _COUNT_SUFFIXES[m.group(2).lower()]
    if value != value.to_integral_value():
        raise ValueError(f"'{text}' is not a whole number of parameters")
    if value < 1:
        raise ValueError(f"'{text}': give a parameter count above 0, e.g. 16B")
    return int(value)


_DURATION_UNITS = {"s": 1, "sec": 1, "m": 60, "min": 60, "h": 3600}


def parse_duration(text: str) -> float:
    """Seconds from a duration as people write one: '45m' -> 2700, '2h' -> 7200,
    '1h30m' -> 5400, '90s' and '90' -> 90 (s, m or min, h; parts may be
    fractions: '1.5h').

    Raises ValueError with a message naming the accepted forms.
    """
    body = text.strip().lower()
    parts = re.findall(r"(\d+(?:\.\d+)?)\s*(h|min|m|sec|s)?\s*", body)
    units_seen = [u or "s" for _, u in parts]
    if not body or re.fullmatch(r"(?:\d+(?:\.\d+)?\s*(?:h|min|m|sec|s)?\s*)+", body) is None \
            or (len(parts) > 1 and "" in [u for _, u in parts]) or len(set(units_seen)) != len(units_seen):
        raise ValueError(f"'{text}' is not a duration: write it as 45m, 2h, 1h30m or 90s (h, m or min, s)")
    seconds = sum(float(v) * _DURATION_UNITS[u or "s"] for v, u in parts)
    if seconds <= 0:
        raise ValueError(f"'{text}': give a duration above 0, e.g. 45m")
    return seconds


def duration(s: float) -> str:
    """A time span for plans and estimates: 45 -> '45 s', 150 -> '2.5 min', 5400 -> '1.5 h'."""
    if s < 120:
        return f"{s:.0f} s"
    return f"{s / 60:.1f} min" if s < 7200 else f"{s / 3600:.1f} h"


def size(n: float) -> str:
    """A request or tensor size in the largest binary unit it reaches, whole
    when exact: 524288 -> '512 KiB', 1536 -> '1.5 KiB', 100 -> '100 B'."""
    for unit, scale in _BINARY:
        if n >= scale:
            v = n / scale
            return f"{v:.0f} {unit}" if v == int(v) else f"{v:.1f} {unit}"
    return f"{n:.0f} B"


def short_size(n: int) -> str:
    """A compact binary size for histogram labels: 524288 -> '512K', 1048576 -> '1M', 512 -> '512'."""
    for unit, scale in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n >= scale:
            return f"{n / scale:g}{unit}"
    return str(n)


def mib(n: float) -> str:
    """Memory, buffers or space in binary units: MiB to one decimal below
    1 GiB, GiB to two from there: 10485760 -> '10.0 MiB', 3 << 30 -> '3.00 GiB'."""
    return f"{n / (1 << 30):,.2f} GiB" if n >= 1 << 30 else f"{n / (1 << 20):,.1f} MiB"


def volume(n: float) -> str:
    """Bytes moved, written or held (a volume, a capacity) in the largest
    decimal unit they reach: 12058624 -> '12.06 MB', 24e12 -> '24.00 TB', 512 -> '512 B'."""
    for unit, scale in _DECIMAL:
        if n >= scale:
            return f"{n / scale:,.2f} {unit}"
    return f"{n:.0f} B"


def mb(n: float | None) -> str:
    """Bytes as a bare number of decimal MB, for a column or sentence that
    names the unit: 12345678 -> '12.3', 2.5e9 -> '2,500.0', None -> '-'."""
    return "-" if n is None else f"{n / 1e6:,.1f}"


def rate(bytes_per_s: float | None) -> str:
    """Throughput as a bare number of decimal MB/s (as mb()), for a column or
    sentence that names the unit: 2e8 -> '200.0', None -> '-'."""
    return mb(bytes_per_s)


def mb_s(bytes_per_s: float | None) -> str:
    """Throughput with its unit: 2e8 -> '200.0 MB/s', None -> '-'."""
    return "-" if bytes_per_s is None else f"{mb(bytes_per_s)} MB/s"


def gb(n: float | None) -> str:
    """Bytes as a bare number of decimal GB to the MB, for a column or
    sentence that names the unit: 480000000 -> '0.480', None -> '-'."""
    return "-" if n is None else f"{n / 1e9:,.3f}"


def count(n: float) -> str:
    """A whole count with thousands separators: 12345.6 -> '12,346'."""
    return f"{n:,.0f}"


def latency(ns: float | None) -> str:
    """Nanoseconds in the largest unit they reach: 1500 -> '2 µs', 2500000 -> '2.50 ms', None -> '-'."""
    if ns is None:
        return "-"
    if ns >= 1e9:
        return f"{ns / 1e9:.2f} s"
    if ns >= 1e6:
        return f"{ns / 1e6:.2f} ms"
    if ns >= 1e3:
        return f"{ns / 1e3:.0f} µs"
    return f"{ns:.0f} ns"


def seconds(s: float) -> str:
    """A duration: 2 -> '2.00 s', minutes from 120 s: 150 -> '2.5 min'."""
    return f"{s:.2f} s" if s < 120 else f"{s / 60:.1f} min"


def step_time(s: float | None) -> str:
    """A step time to the millisecond: 0.4 -> '0.400 s', None -> '-'."""
    return "-" if s is None else f"{s:.3f} s"
