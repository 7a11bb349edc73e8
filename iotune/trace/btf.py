"""The one reader of the kernel's BTF: member offsets of structs and unions
(members of anonymous unions and structs included) and enumerator values,
which the probes take as -D constants (probe.KernelLayout for blockio.c,
appprobe.app_layout for appio.c).

Offsets are flattened through anonymous members because appio.c reads
fields that sit inside anonymous unions (struct io_kiocb's request data,
struct io_cqe's fd): `io_kiocb.cmd` is not a name in BTF, but io_rw lives at
the start of the anonymous union at offset 0."""

from __future__ import annotations

import struct
from pathlib import Path

from ..errors import ProbeError
from .kernel import VMLINUX_BTF

BTF_STRUCT, BTF_UNION, BTF_ENUM = 4, 5, 6
# bytes after the 12-byte type header: fixed, and per vlen item (BTF_KIND_* numbers)
BTF_EXTRA = {1: 4, 3: 12, 14: 4, 17: 4}
BTF_PER_ITEM = {4: 12, 5: 12, 6: 8, 13: 8, 15: 12, 19: 12}

# (name, member type id, bit offset); name "" for an anonymous member
Members = list[tuple[str, int, int]]


def read_types(data: bytes) -> tuple[dict[int, Members], dict[str, int], dict[str, int]]:
    """(type id -> members of every struct and union, struct name -> its
    first type id, enumerator -> value)."""
    magic, _, _, hdr_len, type_off, type_len, str_off, _ = struct.unpack_from("<HBBIIIII", data, 0)
    if magic != 0xEB9F:
        raise ProbeError("the kernel's BTF has an unknown format; iotune cannot read the kernel's struct layouts")
    strings = hdr_len + str_off

    def name(off: int) -> str:
        return data[strings + off:data.index(b"\0", strings + off)].decode() if off else ""

    aggregates: dict[int, Members] = {}
    by_name: dict[str, int] = {}
    enums: dict[str, int] = {}
    pos, end, type_id = hdr_len + type_off, hdr_len + type_off + type_len, 1
    while pos < end:
        name_off, info, _ = struct.unpack_from("<III", data, pos)
        pos += 12
        kind, vlen, bitfields = (info >> 24) & 0x1F, info & 0xFFFF, info >> 31
        if kind in (BTF_STRUCT, BTF_UNION):
            items = struct.iter_unpack("<III", data[pos:pos + 12 * vlen])
            aggregates[type_id] = [(name(m), t, (off & 0xFFFFFF) if bitfields else off) for m, t, off in items]
            if name_off:
                by_name.setdefault(name(name_off), type_id)
        elif kind == BTF_ENUM:
            for e, val in struct.iter_unpack("<Ii", data[pos:pos + 8 * vlen]):
                enums[name(e)] = val
        pos += BTF_EXTRA.get(kind, 0) + BTF_PER_ITEM.get(kind, 0) * vlen
        type_id += 1
    return aggregates, by_name, enums


def flat_offsets(aggregates: dict[int, Members], type_id: int, base_bits: int = 0) -> dict[str, int]:
    """Byte offset of every named member of a struct or union, members of
    its anonymous unions and structs included (the outer name wins)."""
    out: dict[str, int] = {}
    for mname, mtype, off in aggregates.get(type_id, []):
        if mname:
            out.setdefault(mname, (base_bits + off) // 8)
        elif mtype in aggregates:
            for k, v in flat_offsets(aggregates, mtype, base_bits + off).items():
                out.setdefault(k, v)
    return out


def offsets(data: bytes, wanted: dict[str, tuple[str, str]], enumerators: dict[str, str]
            ) -> tuple[dict[str, int], list[str]]:
    """(-D name -> offset or value, names of what is missing) for `wanted`
    (-D name -> (struct, member)) and `enumerators` (-D name -> enumerator)."""
    aggregates, by_name, enums = read_types(data)
    flat: dict[str, dict[str, int]] = {}
    values: dict[str, int] = {}
    missing: list[str] = []
    for key, (st, member) in wanted.items():
        if st not in flat:
            flat[st] = flat_offsets(aggregates, by_name[st]) if st in by_name else {}
        off = flat[st].get(member)
        if off is None:
            missing.append(f"struct {st}.{member}")
        values[key] = -1 if off is None else off
    for key, enumerator in enumerators.items():
        if enumerator not in enums:
            missing.append(enumerator)
        values[key] = enums.get(enumerator, -1)
    return values, missing


BTF_FIX = "use a kernel built with CONFIG_DEBUG_INFO_BTF=y (the default in major distributions)"


def kernel_offsets(wanted: dict[str, tuple[str, str]], enumerators: dict[str, str], reader: str, takes: str,
                   needs: str, path: Path = VMLINUX_BTF) -> dict[str, int]:
    """`offsets` of the running kernel's BTF at `path`. A ProbeError when
    it cannot be read (naming what `reader` takes from it) or lacks any of
    them (naming what `reader` needs)."""
    try:
        data = path.read_bytes()
    except OSError:
        raise ProbeError(f"cannot read the kernel's BTF ({path}): {reader} takes {takes} from it; {BTF_FIX}") from None
    values, missing = offsets(data, wanted, enumerators)
    if missing:
        raise ProbeError(f"this kernel's BTF lacks {', '.join(missing)}, which {reader} reads; {needs}")
    return values
