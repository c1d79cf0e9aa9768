"""A problem's C arguments laid out in an arena: one *slot* is one full set of arguments.

``SlotGroup`` holds ``n`` slots of one shape (buffers for every input and output, each between
guard zones) plus, when the inputs are to be mutated per call, one donor buffer per input (valid
values of the same shape, from another draw of the problem's generator). The trusted side keeps
its own copy of every input it writes; ``check`` compares the arena against those copies, so a
kernel that writes to an input, or outside any buffer, is seen whatever it reports.
"""

from __future__ import annotations

import numpy as np

from swarmfactory.harness.arena import KINDS, Arena, Buffer, buffer_span, replay
from swarmfactory.problems.spec import NP_DTYPES, Problem

# What changes before every timed call, so that a kernel keeping private copies of its inputs and
# updating only what changed (a diff-and-patch memo) must redo the op's rows: an input beside a
# larger one (an activation beside weights, a query beside its KV cache, a weight vector beside
# its rows: at most FULL_REWRITE_SHARE of the largest input, and FULL_REWRITE_MAX bytes) is
# rewritten whole, from the donor rotated at random; every other input gets a fresh unit in every
# row (each row of a matrix, of quantised blocks), so no row's result survives a call. All of it
# counts against the candidate: it is a few percent of a call at most.
FULL_REWRITE_SHARE = 0.25
FULL_REWRITE_MAX = 1 << 20


def mutation_plan(problem: Problem, shape) -> tuple[set[str], dict[str, int]]:
    """(inputs rewritten whole, rows of every other input) of ``problem`` at ``shape``."""
    sizes, shapes = arg_sizes(problem, shape), _arg_shapes(problem, shape)
    inputs = [a for a in problem.args if a.kind == "in"]
    largest = max((sizes[a.name] for a in inputs), default=0)
    full, rows = set(), {}
    for a in inputs:
        if sizes[a.name] <= min(FULL_REWRITE_SHARE * largest, FULL_REWRITE_MAX):
            full.add(a.name)
            continue
        dims = shapes[a.name]
        units = sizes[a.name] // (np.dtype(NP_DTYPES[a.dtype]).itemsize * a.block)
        per_row = dims[-1] // a.block if len(dims) > 1 and dims[-1] % a.block == 0 else units
        rows[a.name] = units // per_row if per_row and units % per_row == 0 else 1
    return full, rows


def _nbytes(problem: Problem, arg, inputs_or_shapes) -> int:
    value = inputs_or_shapes[arg.name]
    shape = value.shape if isinstance(value, np.ndarray) else tuple(value)
    return int(np.prod(shape)) * np.dtype(NP_DTYPES[arg.dtype]).itemsize


def group_bytes(problem: Problem, shape, n: int, donors: int) -> int:
    """Arena data bytes a ``SlotGroup`` of ``n`` slots of ``shape`` with ``donors`` donor draws
    needs."""
    sizes = arg_sizes(problem, shape)
    per_slot = sum(buffer_span(b) for b in sizes.values())
    donor = sum(buffer_span(sizes[a.name]) for a in problem.args if a.kind == "in")
    return n * per_slot + int(donors) * donor


def arg_sizes(problem: Problem, shape) -> dict[str, int]:
    """Bytes of every pointer argument at ``shape`` (inputs from the problem's own generator)."""
    return _layout(problem, shape)[0]


def _arg_shapes(problem: Problem, shape) -> dict[str, tuple[int, ...]]:
    return _layout(problem, shape)[1]


def _layout(problem: Problem, shape) -> tuple[dict[str, int], dict[str, tuple[int, ...]]]:
    key = (problem.name, problem.spec_hash(), tuple(sorted(dict(shape).items())))
    if key not in _SIZES:
        inputs = problem.make_inputs(dict(shape), np.random.default_rng(0), problem.dists[0])
        outs = problem.output_shapes(dict(shape))
        sizes, shapes = {}, {}
        for a in problem.args:
            if a.kind == "in":
                arr = np.asarray(inputs[a.name])
                sizes[a.name], shapes[a.name] = arr.nbytes, arr.shape
            elif a.kind == "out":
                sizes[a.name] = int(np.prod(outs[a.name])) * np.dtype(NP_DTYPES[a.dtype]).itemsize
                shapes[a.name] = tuple(outs[a.name])
        _SIZES[key] = (sizes, shapes)
    return _SIZES[key]


_SIZES: dict[tuple, tuple[dict, dict]] = {}


class SlotGroup:
    """``n`` slots of one shape; with ``donors`` (one draw, or a list of draws), the values the
    driver mutates the inputs from: slot ``i`` takes them from draw ``i % len(donors)``, so a
    set and what it is mutated from always come from the same value distribution."""

    def __init__(self, arena: Arena, problem: Problem, shape, first: int, n: int,
                 donors: dict | list[dict] | None = None):
        self.arena, self.problem, self.shape, self.first, self.n = arena, problem, dict(shape), first, n
        sizes = arg_sizes(problem, shape)
        self.out_shapes = problem.output_shapes(self.shape)
        self.bufs: list[dict[str, Buffer]] = [
            {a.name: arena.alloc(sizes[a.name]) for a in problem.args if a.kind in ("in", "out")}
            for _ in range(n)]
        self.copies: list[dict[str, np.ndarray]] = [{} for _ in range(n)]
        self.scalars: list[dict] = [{} for _ in range(n)]
        draws = [] if donors is None else [donors] if isinstance(donors, dict) else list(donors)
        self.donor_sets: list[dict[str, tuple[Buffer, np.ndarray]]] = []
        self.full, self.rows = mutation_plan(problem, shape) if draws else (set(), {})
        self.fresh: dict[tuple, np.ndarray] = {}  # values for probes into donors (sampling.py)
        self.fresh_draws: dict[int, tuple[dict, int]] = {}  # per donor kind: a draw and the refreshes it served
        for draw in draws:
            kept = {}
            for a in problem.args:
                if a.kind == "in":
                    arr = np.ascontiguousarray(draw[a.name])
                    buf = arena.alloc(arr.nbytes)
                    arena.write(buf, arr)
                    kept[a.name] = (buf, arr)
            self.donor_sets.append(kept)

    @property
    def donors(self) -> dict[str, tuple[Buffer, np.ndarray]]:
        """The first donor draw (its keys: the inputs that are mutated)."""
        return self.donor_sets[0] if self.donor_sets else {}

    def donor_kind(self, i: int) -> int:
        return i % len(self.donor_sets)

    def donor(self, i: int, name: str) -> tuple[Buffer, np.ndarray]:
        """(buffer, trusted copy) of the donor slot ``i``'s input ``name`` is mutated from."""
        return self.donor_sets[self.donor_kind(i)][name]

    # -- writing ----------------------------------------------------------------------------------
    def load(self, i: int, inputs: dict, poison: float = float("nan")) -> None:
        """Slot ``i`` gets ``inputs`` (a private copy is kept), poisoned outputs, fresh guards."""
        bufs = self.bufs[i]
        for a in self.problem.args:
            if a.kind == "in":
                arr = np.ascontiguousarray(inputs[a.name], dtype=NP_DTYPES[a.dtype])
                self.arena.write(bufs[a.name], arr)
                self.copies[i][a.name] = arr.copy()
        self.poison(i, poison)
        for buf in bufs.values():
            self.arena.reset_guards(buf)
        self.scalars[i] = {a.name: inputs[a.name] for a in self.problem.args if a.kind in ("int", "float")}
        self._describe(i)

    def poison(self, i: int, value: float = float("nan")) -> None:
        for a in self.problem.outputs:
            view = self.arena.view(self.bufs[i][a.name], NP_DTYPES[a.dtype], self.out_shapes[a.name])
            view.fill(value)

    def _describe(self, i: int) -> None:
        rows = []
        for a in self.problem.args:
            if a.kind in ("in", "out"):
                buf = self.bufs[i][a.name]
                item = np.dtype(NP_DTYPES[a.dtype]).itemsize
                unit = item * a.block
                count = buf.nbytes // unit if unit else 0
                donor_off = donor_count = 0
                if a.kind == "in" and a.name in self.donors:
                    dbuf, _ = self.donor(i, a.name)
                    donor_off, donor_count = dbuf.offset, dbuf.nbytes // unit
                kind = "in_full" if a.name in self.full else a.kind
                rows.append((KINDS[kind], unit, buf.offset, count, donor_off, donor_count,
                             self.rows.get(a.name, 1) if a.kind == "in" else 0, 0.0))
            elif a.kind == "int":
                rows.append((KINDS["int"], 0, 0, 0, 0, 0, int(self.scalars[i][a.name]), 0.0))
            else:
                rows.append((KINDS["float"], 0, 0, 0, 0, 0, 0, float(self.scalars[i][a.name])))
        self.arena.write_slot(self.first + i, rows)

    # -- reading ----------------------------------------------------------------------------------
    def outputs(self, i: int) -> dict[str, np.ndarray]:
        return {a.name: self.arena.view(self.bufs[i][a.name], NP_DTYPES[a.dtype], self.out_shapes[a.name]).copy()
                for a in self.problem.outputs}

    def inputs(self, i: int, copy: bool = True) -> dict:
        """The trusted copy of slot ``i``'s inputs (after any replayed mutations), with scalars;
        ``copy=False`` for a read-only look (no array may then be changed)."""
        arrays = {k: v.copy() for k, v in self.copies[i].items()} if copy else dict(self.copies[i])
        return {**arrays, **self.scalars[i]}

    def replay(self, i: int, seed: int, calls: np.ndarray) -> None:
        """Apply to the trusted copy of slot ``i`` the mutations the driver made on ``calls``."""
        self.copies[i].update(self.replayed(i, seed, calls))

    def replayed(self, i: int, seed: int, calls: np.ndarray) -> dict[str, np.ndarray]:
        """The trusted copies of slot ``i``'s mutated inputs after ``calls``, without changing them."""
        out, rank = {}, 0
        for a in self.problem.args:
            if a.kind != "in" or a.name not in self.donors:
                continue
            item = np.dtype(NP_DTYPES[a.dtype]).itemsize * a.block
            arr = self.copies[i][a.name].copy()
            units = arr.reshape(-1).view(np.uint8).reshape(-1, item)
            donor = self.donor(i, a.name)[1].reshape(-1).view(np.uint8).reshape(-1, item)
            replay(units, donor, seed, calls, rank, full=a.name in self.full, rows=self.rows.get(a.name, 1))
            out[a.name] = arr
            rank += 1
        return out

    def equals(self, i: int, name: str, array: np.ndarray) -> bool:
        """Does input ``name`` of slot ``i`` in the arena hold exactly ``array``?"""
        return bool(np.array_equal(self.arena.read(self.bufs[i][name]),
                                   np.ascontiguousarray(array).reshape(-1).view(np.uint8)))

    def damage(self, i: int) -> str | None:
        """None if slot ``i``'s inputs equal the trusted copies and every guard is intact."""
        for a in self.problem.args:
            if a.kind not in ("in", "out"):
                continue
            buf = self.bufs[i][a.name]
            where = self.arena.guard_damage(buf)
            if where:
                return f"the kernel {where} of `{a.name}` ({buf.nbytes} bytes)"
        return None

    def changed_inputs(self, i: int) -> list[str]:
        changed = []
        for name, copy in self.copies[i].items():
            now = self.arena.read(self.bufs[i][name])
            if not np.array_equal(now, copy.reshape(-1).view(np.uint8)):
                changed.append(name)
        return changed
