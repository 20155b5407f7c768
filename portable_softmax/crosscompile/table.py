"""The table of known resources (``kernel_resources``) from a compile report: every variant it
compiled, and the register-capped forms of each that a launch may weigh (``launch_plan``'s
``softmax_variant``: ``split_planner.split_fit``, ``tile_fill``, ``tile_fit``), each with what its binary
occupies, keyed as a launch looks them up (``kernel_resources.variant_key``).

    portable-softmax compile --target cuda:90 --target hip:gfx942 --log --table portable_softmax/kernel_resources

writes (or extends) ``<backend>-<arch>-triton-<version>.json`` there for each target, for the
Triton that compiled them.
"""
from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Optional

from portable_softmax import variants
from portable_softmax.backend import get_backend
from portable_softmax.kernel_resources import (ResourceTable, merged, spec_signature, table_file_name, table_for,
                                               table_from_json, variant_key)
from portable_softmax.plan_grid import KernelConfig
from portable_softmax.record import DeviceRecord, KernelResources
from portable_softmax.targets import split_fit, tile_fill, tile_fit
from portable_softmax.crosscompile.cases import Case, _fused_scalars
from portable_softmax.crosscompile.compiling import compile_all


def capped_options(record: DeviceRecord, case: Case, config: KernelConfig, held: int) -> list[dict[str, Any]]:
    """The register caps a launch of ``case`` may weigh for ``config``, whose binary holds ``held``
    programs per unit uncapped (``launch_plan._fitted`` asks for caps that would hold more), as
    compile options to add to the variant's own (a loss kernel's: its split forward's); none for
    the sharded and sliced kernels, which launch as planned."""
    if case.sharded or config.regime == variants.SLICED:
        return []
    caps = split_fit(record, config, case.input_bytes)
    if not case.loss:
        tiles = variants.scalar_arguments(config, 1, case.rows, case.cols, case.tensor_strides,
                                          _fused_scalars(case))[0]
        caps = [*(caps or tile_fill(record, config, case.input_bytes)), *tile_fit(record, config, tiles)]
    found: list[dict[str, Any]] = []
    for programs, fit in caps:
        if programs > held and fit not in found:
            found.append(fit)
    return found


def compile_table(record: DeviceRecord, compiled: Sequence[tuple[Case, KernelConfig, Mapping[str, Any], Mapping[str, Any]]],
                  *, jobs: int, timeout: float, progress: Optional[Callable[[int, dict[str, Any]], None]] = None
                  ) -> dict[str, KernelResources]:
    """The rows of ``record``'s target: each (case, configuration, spec, result) compiled by the
    report, and the register-capped forms a launch may weigh for them (``capped_options``),
    compiled here."""
    rows = table_rows([spec for _, _, spec, _ in compiled], [result for *_, result in compiled])
    backend = get_backend(record.backend)
    capped: dict[str, dict[str, Any]] = {}
    for case, config, spec, result in compiled:
        if result["status"] == "ok":
            held = backend.occupancy(record, rows[spec_key(spec)])
            for fit in capped_options(record, case, config, held):
                form = {**spec, "options": {**spec["options"], **fit}}
                capped.setdefault(spec_key(form), form)
    specs = list(capped.values())
    rows.update(table_rows(specs, compile_all(specs, jobs=jobs, timeout=timeout, progress=progress)))
    return rows


def spec_key(spec: Mapping[str, Any]) -> str:
    """The ``variant_key`` of a compiled variant's spec (``cases.variant_spec``): its first
    argument is the data's pointer."""
    return variant_key(spec["kernel"], spec["args"][0][0], spec_signature(spec["args"]), spec["constexprs"],
                       spec["options"])


def table_rows(specs: Sequence[Mapping[str, Any]], results: Sequence[Mapping[str, Any]]) -> dict[str, KernelResources]:
    """The rows of the variants that compiled: what a launch reads of its binary
    (``launch._compiled_resources``), as ``crosscompile.compiling`` read it without a driver."""
    rows = {}
    for spec, result in zip(specs, results):
        if result["status"] == "ok":
            rows[spec_key(spec)] = KernelResources(registers=result["registers"], shared_memory=result["shared"],
                                                   num_warps=spec["options"]["num_warps"], spills=result["spills"],
                                                   sgprs=result.get("sgprs", 0))
    return rows


def write_table(folder: str, record: DeviceRecord, triton: str, rows: Mapping[str, KernelResources],
                cases: Sequence[Case]) -> str:
    """Write ``rows``, compiled for ``cases``, over the table already in ``folder`` for
    ``record``'s target and ``triton``; returns the file's path."""
    path = os.path.join(folder, table_file_name(record.backend, record.arch, triton))
    table = ResourceTable(record.backend, record.arch, triton)
    if os.path.exists(path):
        with open(path) as handle:
            table = table_from_json(handle.read())
    os.makedirs(folder, exist_ok=True)
    with open(path, "w") as handle:
        handle.write(merged(table, rows, tuple(dataclasses.asdict(case) for case in cases)).to_json())
    table_for.cache_clear()
    return path
