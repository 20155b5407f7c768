"""What compiled kernel variants occupy, known before compiling them: per target (backend and
architecture) and Triton version, the registers, shared memory and spills of each variant, as
the compile report read them from binaries compiled for that target on a machine without it
(``portable-softmax compile --table``, ``crosscompile``). A first call plans from these rows
(``launch_plan``) and compiles only what it launches, then checks that binary's own numbers
against them.

Plain data and its key: no torch, no Triton, no driver. The tables are package data,
``kernel_resources/<backend>-<arch>-triton-<version>.json``; a target or Triton version without
one has an empty table, and planning estimates (``planner.estimate_resources``).
"""
from __future__ import annotations

import functools
import json
from collections.abc import Mapping
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
LAUNCH_ONLY_OPTIONS = ("launch_cooperative_grid",)
# Constexprs that choose what a kernel computes around the same loads, block shape and warps (log
# or not, the fused terms, the loss's options): a variant without a row of its own takes the row
# of one that differs from it only in these, a nearer guess than an estimate.
FORM_CONSTEXPRS = frozenset({"LOG", "SCALE", "MASK", "CAUSAL", "WEIGHT", "PROB_TARGET", "SMOOTHING", "Z_LOSS",
                             "SOFTCAP"})
# Options a launch may leave to Triton's default, as the value that default has (Triton 3.2 to 3.9
# fuse multiply-adds unless told not to): the same binary either way.
OPTION_DEFAULTS = {"enable_fp_fusion": True}


def variant_key(kernel: str, pointer: str, constexprs: Mapping[str, Any], options: Mapping[str, Any]) -> str:
    """The key of one compiled variant: the kernel, its data's pointer type (``POINTER_TYPES``),
    its constexprs and its compile options, as one readable line.

    The integer arguments' specialisation (divisibility by 16, equal to 1) is not in the key: a
    row holds one shape's binary of the variant, and a launch checks its own binary against it
    (``launch_plan.plan_checked``)."""
    compile_options = {**OPTION_DEFAULTS, **{k: v for k, v in options.items() if k not in LAUNCH_ONLY_OPTIONS}}
    specialised = " ".join(f"{name}={_value(value)}" for name, value in sorted(constexprs.items()))
    compiled = " ".join(f"{name}={_value(value)}" for name, value in sorted(compile_options.items()))
    return f"{kernel} {pointer} {specialised} | {compiled}"


def _value(value: Any) -> str:
    return str(int(value)) if isinstance(value, bool) else str(value)


def _shape_key(key: str) -> str:
    """``key`` without its ``FORM_CONSTEXPRS``: what variants of one shape and other forms share."""
    head, _, options = key.partition(" | ")
    kernel, pointer, *constexprs = head.split(" ")
    kept = [c for c in constexprs if c.partition("=")[0] not in FORM_CONSTEXPRS]
    return " ".join([kernel, pointer, *kept]) + " | " + options


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
        """The row of ``key``, else of the variant of its shape in another form that holds the
        most registers (``FORM_CONSTEXPRS``), else None."""
        found = self.rows.get(key)
        return found if found is not None else self._by_shape.get(_shape_key(key))

    @functools.cached_property
    def _by_shape(self) -> dict[str, KernelResources]:
        found: dict[str, KernelResources] = {}
        for key, row in self.rows.items():
            shape = _shape_key(key)
            if shape not in found or row.registers > found[shape].registers:
                found[shape] = row
        return found

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
