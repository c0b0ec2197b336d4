"""A GGUF's `general.architecture` from the first bytes of the file, so that a download can be refused before
its weights are fetched (pipeline/hub.py reads the prefix with an HTTP Range request).

    "GGUF" | version u32 | tensor_count u64 | kv_count u64 | kv ... | tensor infos | (aligned) tensor data
    kv: key (u64 length + UTF-8) | value type u32 | value

gguf's GGUFReader needs the whole header (tensor infos included), which for a real model follows a token list
of megabytes; the writers put `general.architecture` first, so a few KiB are enough here.
"""
from __future__ import annotations

import struct
from typing import Callable

from .errors import BuildError

# GGUFValueType -> struct format of a scalar (8: string, 9: array are read apart)
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
FIRST_READ = 4096                 # bytes of the first read; each further read doubles it
MAX_READ = 16 << 20               # past this the prefix is not worth more reads: the build checks it


class _Short(BuildError):
    """The prefix ends inside the value being read: read more."""


class _Cursor:
    def __init__(self, data: bytes):
        self.data, self.pos = data, 0

    def take(self, fmt: str):
        size = struct.calcsize(fmt)
        if self.pos + size > len(self.data):
            raise _Short
        (v,) = struct.unpack_from(fmt, self.data, self.pos)
        self.pos += size
        return v

    def string(self) -> bytes:
        n = self.take("<Q")
        if self.pos + n > len(self.data):
            raise _Short
        self.pos += n
        return self.data[self.pos - n:self.pos]

    def skip_value(self, vtype: int) -> None:
        if vtype == 8:
            self.string()
        elif vtype == 9:
            etype, count = self.take("<I"), self.take("<Q")
            if etype in _SCALARS:      # fixed-size elements: skip them at once
                self.pos += struct.calcsize(_SCALARS[etype]) * count
                if self.pos > len(self.data):
                    raise _Short
            else:
                for _ in range(count):
                    self.skip_value(etype)
        elif vtype in _SCALARS:
            self.take(_SCALARS[vtype])
        else:
            raise BuildError(f"GGUF value type {vtype} is unknown: the file is damaged or of a newer GGUF version")


def _parse(data: bytes, what: str) -> str | None:
    """general.architecture, or None when absent from the header; _Short when `data` ends too soon."""
    c = _Cursor(data)
    if len(data) >= 4 and data[:4] != b"GGUF":
        raise BuildError(f"{what} is not a GGUF file (it starts with {data[:4]!r}, not b'GGUF')")
    c.pos = 4
    version = c.take("<I")
    if version < 2:
        raise BuildError(f"{what} is GGUF version {version}; only versions 2 and 3 are read")
    c.take("<Q")                                            # tensor_count
    for _ in range(c.take("<Q")):                           # kv_count
        key = c.string()
        vtype = c.take("<I")
        if key == b"general.architecture" and vtype == 8:
            return c.string().decode("utf-8", "replace")
        c.skip_value(vtype)
    return None


def gguf_architecture(read: Callable[[int], bytes], what: str) -> str | None:
    """`read(n)` -> the file's first n bytes (fewer at its end). The architecture, or None when it cannot be told
    from the first MAX_READ bytes (the build then reads the whole file and says)."""
    n = FIRST_READ
    while True:
        data = read(n)
        try:
            return _parse(data, what)
        except _Short:
            if len(data) < n:
                raise BuildError(f"{what} ends inside its GGUF header ({len(data)} bytes): it is truncated") from None
            if n >= MAX_READ:
                return None
            n *= 2
