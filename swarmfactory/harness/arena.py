"""The shared arena between the trusted side and the candidate's driver process.

One anonymous memory file (memfd) that both processes map: a header (the driver's call counter
and the halt flag), the slot table (what arguments each call gets) and the data buffers. Every
buffer starts 64-byte aligned (as torch allocates) and sits between two guard zones filled with
NaN-patterned canaries: a write past either end changes a canary, a read past them yields NaN.

The trusted side never reads anything back from here that it trusts: it keeps its own copies
of the inputs (and replays the driver's per-call mutations on them, ``replay``), and it compares
outputs, inputs and canaries against those copies.
"""

from __future__ import annotations

import mmap
import os
import struct
from dataclasses import dataclass

import numpy as np

HEADER_BYTES = 4096
MAX_SLOTS = 256
MAX_ARGS = 24
ARG = struct.Struct("<IIQQQQqd")          # kind, unit, off, count, donor_off, donor_count, ival, fval
SLOT_BYTES = 8 + MAX_ARGS * ARG.size
TABLE_OFFSET = 4096
DATA_OFFSET = TABLE_OFFSET + ((MAX_SLOTS * SLOT_BYTES + 4095) // 4096) * 4096
GUARD = 256
ALIGN = 64
KINDS = {"in": 1, "out": 2, "int": 3, "float": 4, "in_full": 5}
COUNTER_AT, HALT_AT = 0, 64               # separate cache lines


def _align(n: int, a: int = ALIGN) -> int:
    return -(-n // a) * a


def buffer_span(nbytes: int) -> int:
    """Arena bytes one buffer of ``nbytes`` takes with its guards and alignment."""
    return _align(GUARD + _align(max(nbytes, 1)) + GUARD + GUARD)


@dataclass(frozen=True)
class Buffer:
    offset: int     # of the first data byte
    nbytes: int


class Arena:
    """A memfd of fixed size, mapped here; passed to the driver by file descriptor."""

    def __init__(self, data_bytes: int, seed: int):
        self.size = DATA_OFFSET + _align(data_bytes, 4096) + 4096
        self.fd = os.memfd_create("swarmfactory-arena", 0)
        os.ftruncate(self.fd, self.size)
        self.map = mmap.mmap(self.fd, self.size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        self.bytes = np.frombuffer(self.map, dtype=np.uint8)
        self.next = DATA_OFFSET
        rng = np.random.default_rng(seed)
        # quiet-NaN bit patterns with a random payload: unpredictable, and NaN when read as fp32
        words = (0x7FC00000 | rng.integers(0, 1 << 22, GUARD // 4, dtype=np.uint32)).astype(np.uint32)
        self.canary = words.view(np.uint8)

    # -- buffers --------------------------------------------------------------------------------
    def alloc(self, nbytes: int) -> Buffer:
        start = _align(self.next + GUARD)
        end = start + max(nbytes, 1)
        if end + GUARD > self.size:
            raise MemoryError(f"arena of {self.size} bytes is full ({nbytes} more asked)")
        self.next = end + GUARD
        buf = Buffer(start, nbytes)
        self.reset_guards(buf)
        return buf

    def reset_guards(self, buf: Buffer) -> None:
        self.bytes[buf.offset - GUARD: buf.offset] = self.canary
        self.bytes[buf.offset + buf.nbytes: buf.offset + buf.nbytes + GUARD] = self.canary

    def guard_damage(self, buf: Buffer) -> str | None:
        """None if both guards are intact; else which side and how many bytes changed."""
        before = self.bytes[buf.offset - GUARD: buf.offset] != self.canary
        after = self.bytes[buf.offset + buf.nbytes: buf.offset + buf.nbytes + GUARD] != self.canary
        if after.any():
            last = int(np.flatnonzero(after)[-1]) + 1
            return f"wrote past the end (up to byte {last} beyond it)"
        if before.any():
            first = GUARD - int(np.flatnonzero(before)[0])
            return f"wrote before the start (from byte {first} before it)"
        return None

    def view(self, buf: Buffer, dtype, shape) -> np.ndarray:
        dtype = np.dtype(dtype)
        count = int(np.prod(shape)) if len(shape) else 1
        return np.frombuffer(self.map, dtype=dtype, count=count, offset=buf.offset).reshape(shape)

    def write(self, buf: Buffer, array: np.ndarray) -> None:
        data = np.ascontiguousarray(array).view(np.uint8).reshape(-1)
        if data.size != buf.nbytes:
            raise ValueError(f"buffer of {buf.nbytes} bytes, array of {data.size}")
        self.bytes[buf.offset: buf.offset + buf.nbytes] = data

    def read(self, buf: Buffer) -> np.ndarray:
        return self.bytes[buf.offset: buf.offset + buf.nbytes].copy()

    # -- slot table and header --------------------------------------------------------------------
    def write_slot(self, index: int, args: list[tuple]) -> None:
        """``args``: (kind, unit, offset, count, donor_offset, donor_count, ival, fval) per arg."""
        if not 0 <= index < MAX_SLOTS or len(args) > MAX_ARGS:
            raise ValueError(f"slot {index} with {len(args)} args is out of range")
        base = TABLE_OFFSET + index * SLOT_BYTES
        struct.pack_into("<II", self.map, base, len(args), 0)
        for i, a in enumerate(args):
            ARG.pack_into(self.map, base + 8 + i * ARG.size, *a)

    @property
    def counter(self) -> int:
        return struct.unpack_from("<Q", self.map, COUNTER_AT)[0]

    def counter_view(self) -> np.ndarray:
        """The driver's call counter as a live one-element view (for polling)."""
        return np.frombuffer(self.map, dtype=np.uint64, count=1, offset=COUNTER_AT)

    def reset_header(self) -> None:
        struct.pack_into("<Q", self.map, COUNTER_AT, 0)
        struct.pack_into("<Q", self.map, HALT_AT, 0)

    def set_halt(self) -> None:
        struct.pack_into("<Q", self.map, HALT_AT, 1)

    def close(self) -> None:
        try:
            self.bytes = None
            self.map.close()
        except (BufferError, ValueError):
            pass  # a view is still alive somewhere; the mapping goes with the process
        try:
            os.close(self.fd)
        except OSError:
            pass


# -- the driver's per-call mutation, replayed ------------------------------------------------------
_GOLD = np.uint64(0x9E3779B97F4A7C15)
_M1, _M2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)


def splitmix(seed: int, index: np.ndarray) -> np.ndarray:
    """The driver's ``splitmix(seed, i)``, vectorised (uint64 arithmetic wraps, as in C)."""
    with np.errstate(over="ignore"):
        z = np.uint64(seed) + (index.astype(np.uint64) + np.uint64(1)) * _GOLD
        z = (z ^ (z >> np.uint64(30))) * _M1
        z = (z ^ (z >> np.uint64(27))) * _M2
        return z ^ (z >> np.uint64(31))


def mutation_indices(seed: int, calls: np.ndarray, arg_index: int, count: int, donor_count: int,
                     rows: int = 1):
    """(destination unit, donor unit) of input ``arg_index`` (its rank among the mutated inputs)
    for each call index in ``calls``: one per row of the input's ``rows`` equal runs, call by
    call (``rows`` entries per call, row order within a call)."""
    z = splitmix(seed, calls.astype(np.uint64) * np.uint64(64) + np.uint64(arg_index))
    if rows > 1:  # row r > 0 draws splitmix(z, r), row 0 z itself
        per_row = splitmix_each(z[:, None], np.arange(rows, dtype=np.uint64)[None, :])
        per_row[:, 0] = z
        z = per_row.reshape(-1)
    per = np.uint64(count // max(rows, 1))
    lo, hi = z & np.uint64(0xFFFFFFFF), z >> np.uint64(32)
    dst = (lo * per) >> np.uint64(32)
    if rows > 1:
        dst = dst + np.tile(np.arange(rows, dtype=np.uint64), len(calls)) * per
    src = (hi * np.uint64(donor_count)) >> np.uint64(32)
    return dst.astype(np.int64), src.astype(np.int64)


def splitmix_each(seeds: np.ndarray, index: np.ndarray) -> np.ndarray:
    """``splitmix(seed, index)`` elementwise over broadcast ``seeds`` and ``index`` (the driver's
    per-row draws)."""
    with np.errstate(over="ignore"):
        z = seeds.astype(np.uint64) + (index.astype(np.uint64) + np.uint64(1)) * _GOLD
        z = (z ^ (z >> np.uint64(30))) * _M1
        z = (z ^ (z >> np.uint64(27))) * _M2
        return z ^ (z >> np.uint64(31))


def rotation(seed: int, call: int, arg_index: int, donor_count: int) -> int:
    """The donor rotation a wholly rewritten input (kind ``in_full``) gets before ``call``."""
    z = splitmix(seed, np.array([call], dtype=np.uint64) * np.uint64(64) + np.uint64(arg_index))
    return int(((z >> np.uint64(32)) * np.uint64(donor_count) >> np.uint64(32))[0])


def rewritten(units: np.ndarray, donor_units: np.ndarray, rot: int) -> np.ndarray:
    """The input the driver writes for a whole rewrite: the donor's units from ``rot`` on, wrapping."""
    return donor_units[(rot + np.arange(len(units))) % len(donor_units)]


def replay(units: np.ndarray, donor_units: np.ndarray, seed: int, calls: np.ndarray, arg_index: int,
           full: bool = False, rows: int = 1) -> None:
    """Apply, in place and in call order, the mutations the driver made to one input.

    ``units`` is the input viewed as (count, unit bytes); ``calls`` the indices of the calls that
    used this slot, ascending. Where a unit was replaced more than once, the last write wins.
    ``full``: the input is rewritten whole before every call (the last call's rewrite stands)."""
    if len(calls) == 0:
        return
    if full:
        units[:] = rewritten(units, donor_units, rotation(seed, int(calls[-1]), arg_index, len(donor_units)))
        return
    dst, src = mutation_indices(seed, calls, arg_index, len(units), len(donor_units), rows)
    rev_unique, first_in_rev = np.unique(dst[::-1], return_index=True)
    last = len(dst) - 1 - first_in_rev
    units[rev_unique] = donor_units[src[last]]
