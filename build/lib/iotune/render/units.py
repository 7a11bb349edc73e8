"""Number formatting with explicit units.

Throughput and volumes are decimal (MB/s, GB: 10**6, 10**9 bytes); request
sizes are binary (KiB, MiB: 2**10, 2**20), as block-layer tools print them.
"""

from __future__ import annotations

_BINARY = (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10))
_DECIMAL = (("TB", 10**12), ("GB", 10**9), ("MB", 10**6), ("kB", 10**3))


def size(n: float) -> str:
    """A request size in binary units: 524288 -> '512 KiB', 1536 -> '1.5 KiB'."""
    for unit, scale in _BINARY:
        if n >= scale:
            v = n / scale
            return f"{v:.0f} {unit}" if v == int(v) else f"{v:.1f} {unit}"
    return f"{n:.0f} B"


def short_size(n: int) -> str:
    """Compact binary size for histogram labels: 512K, 1M, 4K, 512."""
    for unit, scale in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n >= scale:
            return f"{n / scale:g}{unit}"
    return str(n)


def volume(n: float) -> str:
    """Bytes moved, decimal: 12058624 -> '12.06 MB'."""
    for unit, scale in _DECIMAL:
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n:.0f} B"


def rate(bytes_per_s: float) -> str:
    """Throughput in decimal MB/s."""
    return f"{bytes_per_s / 1e6:,.1f}"


def count(n: float) -> str:
    return f"{n:,.0f}"


def latency(ns: float | None) -> str:
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
    return f"{s:.2f} s" if s < 120 else f"{s / 60:.1f} min"
