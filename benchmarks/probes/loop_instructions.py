"""What the softmax's streamed rows (``softmax_forward_loop``: the statistics pass, then the output
pass) issue per element, and how many barriers each pass holds: sm_90 SASS (nvdisasm) and gfx942
AMDGCN (Triton's ``asm["amdgcn"]``), cross-compiled here with this machine's Triton, the loop
regime forced (the plan without the split path, as ``tests/regimes.force_regime`` plans it), bf16
and float32, plain and fused (a per-row scale tensor, a bool mask, causal: the compile report's
fused form). No GPU (NOTES v36).

    PYTHONPATH=. python benchmarks/probes/loop_instructions.py [--target cuda:90=h200 ...]
        [--shape 4096x50257 ...] [--dtype bfloat16 ...] [--form plain ...] [--chunk 8192] [--json OUT]

Counts are static: a loop's instructions from its backward branch's target to the branch, both
sides of a branch inside it counted. The innermost loops of the kernel, in address order, are the
statistics pass (``_online_stats``) and the output pass; ``per elt`` is a loop's instructions over
the elements a thread holds of a block (BLOCK_N / (warps * warp size)). Barriers: ``BAR`` (SASS),
``s_barrier`` (AMDGCN); shuffles: ``SHFL`` / ``ds_swizzle``, ``ds_(b)permute``, ``v_readlane``, DPP
moves and arithmetic (``*_dpp``); shared memory: ``STS``/``LDS`` / ``ds_write``/``ds_read``. Registers: cuobjdump's (uncapped) / ``.vgpr_count``;
spills: local and stack bytes / 4 / the private segment / 4.
"""
from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import re

from portable_softmax.amdgcn import amdgcn_resources
from portable_softmax.crosscompile import (Case, compiled_variant, cubin_resources, cubin_sass, parse_target,
                                           target_record)
from portable_softmax.crosscompile.cases import variant_spec
from portable_softmax.targets import select_config

TARGETS = ("cuda:90=h200", "hip:gfx942")
SHAPES = ("4096x50257", "32x128256")
DTYPES = ("bfloat16", "float32")
FORMS = ("plain", "fused")

SASS_LINE = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)([^;]*)")
SASS_LABEL = re.compile(r"^(\.L_x_\d+):")
# A block starts at a label or LLVM's ``; %bb.N:`` comment; an instruction line is indented.
GCN_BLOCK = re.compile(r"^(\.LBB\d+_\d+:|; %bb\.\d+:)")
GCN_LINE = re.compile(r"^\s+([a-z][a-z0-9_]*)\b")

BARRIERS = {"BAR", "s_barrier"}
SHUFFLES = {"SHFL", "ds_swizzle_b32", "ds_bpermute_b32", "ds_permute_b32", "v_readlane_b32"}
SHARED = ("STS", "LDS", "ds_write", "ds_read")


def sass_loops(sass: str) -> tuple[list[str], list[list[int]]]:
    """The opcodes of a kernel's SASS in address order (modifiers dropped), and its innermost
    loops as lists of instruction indices: a loop runs from a backward branch's target to the
    latest branch back to it (ptxas lays a loop out contiguously). The branch to itself that
    ends a kernel after its ``EXIT`` is no loop."""
    ops: list[str] = []
    labels: dict[str, int] = {}
    ends: dict[str, int] = {}
    pending: list[str] = []
    for line in sass.splitlines():
        label = SASS_LABEL.match(line)
        if label:
            pending.append(label.group(1))
            continue
        found = SASS_LINE.search(line)
        if not found:
            continue
        labels.update((name, len(ops)) for name in pending)
        pending = []
        target = re.search(r"(\.L_x_\d+)", found.group(3)) if found.group(2) == "BRA" else None
        if target and labels.get(target.group(1), len(ops) + 1) < len(ops):
            ends[target.group(1)] = len(ops)
        ops.append(found.group(2))
    spans = [(labels[name], end) for name, end in ends.items()]
    inner = [(a, b) for a, b in spans if not any((a, b) != (c, d) and a <= c and d <= b for c, d in spans)]
    return ops, [list(range(a, b + 1)) for a, b in sorted(inner)]


def amdgcn_loops(text: str) -> tuple[list[str], list[list[int]]]:
    """The opcodes of a kernel's AMDGCN text in order, and its innermost loops as lists of
    instruction indices, from LLVM's comments on each block (``This Inner Loop Header``, ``in
    Loop: Header=BB0_6``): a loop's blocks need not be contiguous (a latch often precedes its
    header)."""
    ops: list[str] = []
    owner: list[str] = []
    inner: list[str] = []
    block = loop = ""
    for line in text.splitlines():
        label = GCN_BLOCK.match(line)
        if label:
            block = label.group(1).rstrip(":")
            loop = ""
        header = re.search(r"(?:Inner )?Loop Header: Depth=\d+", line)
        member = re.search(r"in Loop: Header=(BB\d+_\d+)", line)
        if header and block.startswith(".LBB"):
            loop = block[2:]
            if "Inner" in header.group(0):
                inner.append(loop)
        elif member:
            loop = member.group(1)
        found = GCN_LINE.match(line.split(";")[0])
        if found and not label and block:
            ops.append(found.group(1))
            owner.append(loop)
    return ops, [[i for i, name in enumerate(owner) if name == loop] for loop in inner]


def loop_counts(ops: list[str], body: list[int]) -> dict[str, int]:
    body_ops = [ops[i] for i in body]
    return {"instructions": len(body_ops), "barriers": sum(op in BARRIERS for op in body_ops),
            "shuffles": sum(op in SHUFFLES or op.endswith("_dpp") for op in body_ops),
            "shared": sum(op.startswith(SHARED) for op in body_ops)}


def measure(target_text: str, shape: str, dtype: str, form: str, chunk: int) -> dict:
    """The forced loop's config for one problem, and its passes' counts."""
    target = parse_target(target_text)
    record, _, _ = target_record(target)
    rows, cols = (int(n) for n in shape.split("x"))
    case = Case(rows, cols, dtype, False, False, fused=form == "fused")
    config = select_config(record, rows, cols, case.plan_dtype, allow_split=False, rows_per_group=rows,
                           align=case.align, input_bytes=case.input_bytes, causal=case.causal,
                           sliceable=not case.fused)
    assert config.regime == "loop", config
    if chunk:
        config = dataclasses.replace(config, block_n=chunk)
    spec = variant_spec(target, record, config, case)
    compiled, *_ = compiled_variant(spec)
    if target.backend == "cuda":
        ops, loops = sass_loops(cubin_sass(compiled.asm["cubin"]))
        usage = cubin_resources(compiled.asm["cubin"], compiled.metadata.name)
        registers, spills = usage["REG"], (usage.get("LOCAL", 0) + usage.get("STACK", 0)) // 4
    else:
        ops, loops = amdgcn_loops(compiled.asm["amdgcn"])
        usage = amdgcn_resources(compiled.asm["amdgcn"])
        registers, spills = usage["vgpr_count"], usage.get("private_segment_fixed_size", 0) // 4
    per_thread = config.block_m * config.block_n // (config.num_warps * target.warp_size)
    passes = []
    for body in loops:
        counts = loop_counts(ops, body)
        passes.append({**counts, "per_element": round(counts["instructions"] / per_thread, 2)})
    top = collections.Counter(ops[i] for i in loops[0]).most_common(10) if loops else []
    return {"target": target_text, "shape": shape, "dtype": dtype, "form": form, "block_n": config.block_n,
            "warps": config.num_warps, "per_thread": per_thread, "registers": registers, "spills": spills,
            "passes": passes, "stats_top": top}


def _row(found: dict) -> str:
    cells = [found["target"], found["shape"], found["dtype"], found["form"], found["block_n"], found["warps"],
             found["per_thread"], f"{found['registers']} / {found['spills']}"]
    for name in ("stats", "output"):
        index = 0 if name == "stats" else -1
        counts = found["passes"][index] if found["passes"] else {}
        cells += [f"{counts.get('instructions', '-')} ({counts.get('per_element', '-')})",
                  f"{counts.get('barriers', '-')} / {counts.get('shuffles', '-')} / {counts.get('shared', '-')}"]
    cells.append(" ".join(f"{op} {n}" for op, n in found["stats_top"]))
    return "| " + " | ".join(map(str, cells)) + " |"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", action="append", help=f"repeatable (default {TARGETS})")
    parser.add_argument("--shape", action="append", help=f"ROWSxCOLS, repeatable (default {SHAPES})")
    parser.add_argument("--dtype", action="append", help=f"repeatable (default {DTYPES})")
    parser.add_argument("--form", action="append", choices=FORMS, help=f"repeatable (default {FORMS})")
    parser.add_argument("--chunk", type=int, default=0, help="BLOCK_N instead of the plan's (0: the plan's)")
    parser.add_argument("--json", help="also write every count here")
    args = parser.parse_args()
    print("| target | shape | dtype | form | BLOCK_N | warps | elts/thread | regs / spills | stats loop (per elt) "
          "| stats bar / shfl / smem | output loop (per elt) | output bar / shfl / smem | stats top opcodes |")
    print("|" + "---|" * 13)
    found_all = []
    for target in args.target or TARGETS:
        for shape in args.shape or SHAPES:
            for dtype in args.dtype or DTYPES:
                for form in args.form or FORMS:
                    found = measure(target, shape, dtype, form, args.chunk)
                    found_all.append(found)
                    print(_row(found), flush=True)
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(found_all, handle, indent=1)


if __name__ == "__main__":
    main()
