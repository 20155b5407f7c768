"""What compiled kernel variants occupy, known before compiling them: per target (backend and
architecture) and Triton version, the registers, shared memory and spills of each variant, as
the compile report read them from binaries compiled for that target on a machine without it
(``portable-softmax compile --table``, ``crosscompile``). A first call plans from these rows
(``launch_plan``) and compiles only what it launches, then checks that binary's own numbers
against them.

Plain data and its key: no torch, no Triton, no driver. The tables are package data,
``kernel_resources/<backend>-<arch>-triton-<version>.json``; a target or Triton version without
one has an empty table, and planning estimates (``plan_grid.estimate_resources``).
"""
from __future__ import annotations

import functools
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from typing import Any, Optional

from portable_softmax.record import KernelResources

FOLDER = "kernel_resources"
FORMAT = 1

# How Triton names the pointer type of a tensor of each dtype: the data's type is in the key,
# since a variant compiled for bfloat16 data holds other registers than one for float32.
POINTER_TYPES = {"float16": "*fp16", "bfloat16": "*bf16", "float32": "*fp32", "float64": "*fp64"}

# Options that leave the binary's resources as they are: whether the launch asks the driver for a
# cooperative grid. Everything else that is passed to the compiler is in the key.
LAUNCH_ONLY_OPTIONS = ("launch_cooperative_grid", "launch_pdl")
# Constexprs that the target fixes, not the call: whether the kernel holds the instructions of an
# overlapping launch (``kernels/dependency.py``: every launch on sm_90 and up, none elsewhere). A
# table is one target's, so its keys leave them out, and its rows are compiled with the target's
# value (on sm_90 they move a few spills of the every-option forms and a tile's registers by 1-5).
TARGET_CONSTEXPRS = frozenset({"DEPENDENT"})
# Constexprs that choose what a kernel computes around the same loads, block shape and warps (log
# or not, the fused terms, the loss's options): a variant without a row of its own takes the row
# of one that differs from it only in these (or in its arguments' specialisation: another shape),
# a nearer guess than an estimate.
FORM_CONSTEXPRS = frozenset({"LOG", "SCALE", "MASK", "CAUSAL", "WEIGHT", "PROB_TARGET", "SMOOTHING", "Z_LOSS",
                             "SOFTCAP", "COUNTED", "SUMMED"})
# Constexprs that count a split row's chunks: rows of another length, cut into chunks of the same
# block at the same warps and options, hold nearly the same registers (sm_90, bf16 chunks of 8192
# at 4 warps under a cap of 128: 127 in rows of 4 chunks, 128 in rows of 7, NOTES v48), a far
# nearer guess than an estimate, whose register count grows with the elements a thread holds and
# spills under every cap.
CHUNK_CONSTEXPRS = frozenset({"CHUNKS", "CHUNKS_P2"})
# The loss's options among the forms: each adds work an element (a weight's load, the smoothing's
# sum, the z-loss, the tanh) and holds registers by it, so a variant without a row takes a
# neighbour with its options (the 'mean''s row for a 'sum') before one of its shape class with
# others (the every-option form's, 80 spilled words at 2 warps where a 'sum''s binary spills none:
# H200, bf16 4096x50257, 4 programs an SM where the 'mean' runs 10, 0.430 ms against 0.252, NOTES v52).
OPTION_CONSTEXPRS = frozenset({"WEIGHT", "PROB_TARGET", "SMOOTHING", "Z_LOSS", "SOFTCAP"})
# Options a launch may leave to Triton's default, as the value that default has (Triton 3.2 to 3.9
# fuse multiply-adds unless told not to): the same binary either way.
OPTION_DEFAULTS = {"enable_fp_fusion": True}


def variant_key(kernel: str, pointer: str, arguments: str, constexprs: Mapping[str, Any],
                options: Mapping[str, Any]) -> str:
    """The key of one compiled variant: the kernel, its data's pointer type (``POINTER_TYPES``),
    how Triton specialises its scalar arguments (``argument_signature``), its constexprs and its
    compile options, as one readable line."""
    compile_options = {**OPTION_DEFAULTS, **{k: v for k, v in options.items() if k not in LAUNCH_ONLY_OPTIONS}}
    specialised = " ".join(f"{name}={_value(value)}" for name, value in sorted(constexprs.items())
                           if name not in TARGET_CONSTEXPRS)
    compiled = " ".join(f"{name}={_value(value)}" for name, value in sorted(compile_options.items()))
    return f"{kernel} {pointer} args={arguments} {specialised} | {compiled}"


def argument_signature(values: Sequence[Any]) -> str:
    """How Triton specialises a launch's scalar arguments, one letter each: ``1`` an integer equal
    to 1 (a constant), ``D`` / ``i`` a 32-bit integer divisible by 16 / not, ``E`` / ``l`` a
    64-bit one, ``f`` a float. A streamed row of 4096 columns, a multiple of 16, is loaded in
    16-byte vectors through a pipeline (an sm_90 loop kernel: 60 registers and 8 KiB of shared
    memory) where a row of 50257 is not (32 registers, 32 bytes): the same constexprs, two
    binaries."""
    return "".join(_argument_letter(value) for value in values)


def _argument_letter(value: Any) -> str:
    if isinstance(value, float):
        return "f"
    if value == 1:
        return "1"
    wide = not -2**31 <= value < 2**31
    return ("E" if wide else "D") if value % 16 == 0 else ("l" if wide else "i")


def spec_signature(arguments: Sequence[tuple[str, Any]]) -> str:
    """``argument_signature`` of a compile report's arguments (``crosscompile.cases``: (type, 16
    divides it) for each, (``"constexpr"``, 1) for an integer equal to 1), pointers left out."""
    letters = {("i32", True): "D", ("i32", False): "i", ("i64", True): "E", ("i64", False): "l"}
    found = []
    for kind, flag in arguments:
        if kind.startswith("*"):
            continue
        found.append("1" if kind == "constexpr" else "f" if kind.startswith("fp") else letters[(kind, bool(flag))])
    return "".join(found)


def _value(value: Any) -> str:
    return str(int(value)) if isinstance(value, bool) else str(value)


def _near_keys(key: str) -> tuple[str, ...]:
    """The keys of ``key``'s neighbours, nearest first: without its ``FORM_CONSTEXPRS`` (another
    form, the same arguments), without its argument signature (other shapes, the same form),
    without both; then, without its ``CHUNK_CONSTEXPRS`` and arguments too (a split row of
    another length, the same form), and without all three."""
    head, _, options = key.partition(" | ")
    kernel, pointer, arguments, *constexprs = head.split(" ")
    shaped = [c for c in constexprs if c.partition("=")[0] not in FORM_CONSTEXPRS]
    formed = [c for c in constexprs if c.partition("=")[0] not in CHUNK_CONSTEXPRS]
    bare = [c for c in shaped if c.partition("=")[0] not in CHUNK_CONSTEXPRS]
    return (" ".join([kernel, pointer, arguments, *shaped, "|", options]),
            " ".join([kernel, pointer, *constexprs, "|", options]),
            " ".join([kernel, pointer, *shaped, "|", options]),
            " ".join([kernel, pointer, *formed, "|", options]),
            " ".join([kernel, pointer, *bare, "|", options]))


def _form(key: str) -> frozenset[str]:
    """The ``FORM_CONSTEXPRS`` of ``key`` with their values ("LOG=1", ...)."""
    return frozenset(c for c in key.partition(" | ")[0].split(" ") if c.partition("=")[0] in FORM_CONSTEXPRS)


def _options(form: frozenset[str]) -> frozenset[str]:
    """The ``OPTION_CONSTEXPRS`` a ``_form`` takes (those not 0)."""
    return frozenset(c for c in form if c.partition("=")[0] in OPTION_CONSTEXPRS and c.partition("=")[2] != "0")


# A table row as a neighbour: its key's ``_form``, the options it takes (``_options``), the row.
_Neighbour = tuple[frozenset[str], frozenset[str], KernelResources]


@dataclass(frozen=True)
class ResourceTable:
    """The known variants of one target and Triton version, by ``variant_key``.

    Attributes:
        backend: the device records' backend (``cuda``, ``hip``).
        arch: their architecture (``sm_90``, ``gfx942``).
        triton: the Triton version the rows were compiled with; "" for an empty table.
        rows: each variant's resources.
        cases: the problems whose variants the rows hold, as the compile report names them
            (``crosscompile.Case``'s fields): what the table covers, and what its tests plan again.
    """

    backend: str
    arch: str
    triton: str
    rows: Mapping[str, KernelResources] = field(default_factory=dict)
    cases: tuple[Mapping[str, Any], ...] = ()

    def get(self, key: str) -> Optional[KernelResources]:
        """The row of ``key`` (``variant_key``), or None where the table has none."""
        return self.rows.get(key)

    def nearest(self, key: str) -> Optional[KernelResources]:
        """The row of ``key``, else among its neighbours (``_near_keys``) that take none of the
        ``OPTION_CONSTEXPRS`` it leaves off (a guess too gloomy costs the grid, one too hopeful
        a compile: ``launch_plan.plan_checked``) the one whose options differ least from ``key``'s,
        then the nearest, then the one whose other forms differ least, then the one that holds the
        most registers; else None (an estimate)."""
        found = self.rows.get(key)
        if found is not None:
            return found
        form = _form(key)
        options = _options(form)
        ranked = [((len(options - taken), rank, len(form ^ other), -row.registers), row)
                  for rank, (level, near) in enumerate(zip(self._neighbours, _near_keys(key)))
                  for other, taken, row in level.get(near, ()) if taken <= options]
        return min(ranked, key=lambda found: found[0])[1] if ranked else None

    @functools.cached_property
    def _neighbours(self) -> tuple[dict[str, list[_Neighbour]], ...]:
        """Each level's rows by near key (``_near_keys``), with their forms and the options they take."""
        levels: tuple[dict[str, list[_Neighbour]], ...] = ({}, {}, {}, {}, {})
        for key, row in self.rows.items():
            form = _form(key)
            for level, near in zip(levels, _near_keys(key)):
                level.setdefault(near, []).append((form, _options(form), row))
        return levels

    def to_json(self) -> str:
        """The table's file: one row a line, sorted, so that a regenerated table diffs by rows."""
        cases = ",\n".join(f"  {json.dumps(dict(case), sort_keys=True)}" for case in self.cases)
        rows = ",\n".join(f"  {json.dumps(key)}: {json.dumps(_row(found))}" for key, found in sorted(self.rows.items()))
        head = json.dumps({"format": FORMAT, "backend": self.backend, "arch": self.arch, "triton": self.triton})
        return head[:-1] + f', "cases": [\n{cases}\n], "rows": {{\n{rows}\n}}}}\n'


def _row(found: KernelResources) -> dict[str, int]:
    row = {"registers": found.registers, "shared": found.shared_memory, "warps": found.num_warps,
           "spills": found.spills}
    if found.sgprs:
        row["sgprs"] = found.sgprs
    return row


def table_from_json(text: str) -> ResourceTable:
    """A table from its file's text (``ResourceTable.to_json``).

    Raises:
        ValueError: the text is not a table of this format.
    """
    data = json.loads(text)
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ValueError(f"not a kernel resource table of format {FORMAT}: regenerate it with "
                         f"`portable-softmax compile --table`")
    rows = {key: KernelResources(registers=row["registers"], shared_memory=row["shared"], num_warps=row["warps"],
                                 spills=row.get("spills", 0), sgprs=row.get("sgprs", 0))
            for key, row in data["rows"].items()}
    return ResourceTable(data["backend"], data["arch"], data["triton"], rows, tuple(data.get("cases", ())))


def table_file_name(backend: str, arch: str, triton: str) -> str:
    return f"{backend}-{arch}-triton-{triton}.json"


@functools.lru_cache(maxsize=None)
def table_for(backend: str, arch: str, triton: str) -> ResourceTable:
    """The package's table for a target and Triton version; an empty one where it has none (a
    table of another Triton would hold another compiler's register counts)."""
    entry = resources.files("portable_softmax").joinpath(FOLDER, table_file_name(backend, arch, triton))
    if not entry.is_file():
        return ResourceTable(backend, arch, "")
    return table_from_json(entry.read_text())


def merged(table: ResourceTable, rows: Mapping[str, KernelResources],
           cases: tuple[Mapping[str, Any], ...] = ()) -> ResourceTable:
    """``table`` with ``rows`` added over its own (a regenerated variant replaces its row), and
    ``cases`` after its own."""
    known = [dict(case) for case in table.cases]
    return ResourceTable(table.backend, table.arch, table.triton, {**table.rows, **rows},
                         (*table.cases, *(case for case in cases if dict(case) not in known)))
