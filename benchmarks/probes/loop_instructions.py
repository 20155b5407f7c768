"""What the softmax's streamed rows (``softmax_forward_loop``: the statistics pass, then the output
pass) issue per element, and how many barriers each pass holds: sm_90 SASS (nvdisasm) and gfx942
AMDGCN (Triton's ``asm["amdgcn"]``), cross-compiled here with this machine's Triton, the loop
regime forced (the plan without the split path, as ``tests/regimes.force_regime`` plans it), bf16
and float32, plain and fused (a per-row scale tensor, a bool mask, causal: the compile report's
fused form; or one term each). No GPU (NOTES v36).

    PYTHONPATH=. python benchmarks/probes/loop_instructions.py [--target cuda:90=h200 ...]
        [--shape 4096x50257 ...] [--dtype bfloat16 ...] [--form plain ...] [--chunk 8192] [--sliced]
        [--json OUT]

Counts are static: a loop's instructions (``machine_code``'s natural loops), both sides of a branch
within it counted. The kernel's innermost loops, in address order, are the statistics pass
(``_online_stats``) and the output pass; ``per elt`` is a loop's instructions over the elements a
thread holds of a block (BLOCK_N / (warps * warp size)). Barriers: ``BAR`` (SASS), ``s_barrier``
(AMDGCN); shuffles: ``SHFL`` / ``ds_swizzle``, ``ds_(b)permute``, ``v_readlane``, ``v_permlane``,
DPP moves and arithmetic (``*_dpp``); shared memory: ``STS``/``LDS`` / ``ds_write``/``ds_read``.
Registers: cuobjdump's (uncapped) / ``.vgpr_count``; spills: local and stack bytes / 4 / the
private segment / 4.
"""
from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import re

from portable_softmax import machine_code
from portable_softmax.amdgcn import amdgcn_resources
from portable_softmax.crosscompile import (Case, compiled_variant, cubin_resources, cubin_sass, parse_target,
                                           target_record)
from portable_softmax.crosscompile.cases import variant_spec
from portable_softmax.plan_grid import _warps
from portable_softmax.targets import select_config
from portable_softmax.tuning import tuning_for

TARGETS = ("cuda:90=h200", "hip:gfx942")
SHAPES = ("4096x50257", "32x128256")
DTYPES = ("bfloat16", "float32")
# The fused variants' constexprs (``kernels.fused._fused_terms``); "fused" is the compile report's
# form (``crosscompile.cases.FUSED_FORM``: a per-row scale tensor, a bool mask, causal), the others
# one term each. Each compiles with the fused form's arguments, its constexprs replaced.
FORMS = {"plain": None, "fused": {"SCALE": 2, "MASK": 1, "CAUSAL": True},
         "scale": {"SCALE": 2, "MASK": 0, "CAUSAL": False}, "mask": {"SCALE": 0, "MASK": 1, "CAUSAL": False},
         "causal": {"SCALE": 0, "MASK": 0, "CAUSAL": True}}

BARRIERS = ("BAR", "s_barrier")
SHUFFLES = ("SHFL", "ds_swizzle", "ds_bpermute", "ds_permute", "v_readlane", "v_permlane")
SHARED = ("STS", "LDS", "ds_write", "ds_read")


def opcode(text: str) -> str:
    """An instruction's opcode, its SASS predicate and modifiers dropped (``FMUL.FTZ``: ``FMUL``)."""
    return re.sub(r"^@!?U?P\w+\s+", "", text).split()[0].split(".")[0]


def loop_counts(loop: machine_code.Loop) -> tuple[dict, collections.Counter]:
    """A loop's instructions, barriers, shuffles (DPP moves and arithmetic, ``*_dpp``, among them)
    and shared-memory accesses, and each opcode's count."""
    ops = [opcode(text) for text in loop.instructions]
    return ({"instructions": len(ops), "barriers": sum(op.startswith(BARRIERS) for op in ops),
             "shuffles": sum(op.startswith(SHUFFLES) or op.endswith("_dpp") for op in ops),
             "shared": sum(op.startswith(SHARED) for op in ops)}, collections.Counter(ops))


def measure(target_text: str, shape: str, dtype: str, form: str, chunk: int, sliced: bool = False) -> dict:
    """The forced loop's config for one problem, and its passes' counts. ``sliced``: rows sliced
    from a vocabulary padded to 64 and written contiguous (the compile report's sliced case: x's
    rows aligned, y's not), streamed rather than sliced."""
    target = parse_target(target_text)
    record, _, _ = target_record(target)
    rows, cols = (int(n) for n in shape.split("x"))
    case = Case(rows, cols, dtype, False, False, fused=FORMS[form] is not None, sliced=sliced)
    config = select_config(record, rows, cols, case.plan_dtype, allow_split=False, rows_per_group=rows,
                           align=case.align, input_bytes=case.input_bytes, causal=case.causal,
                           sliceable=False)
    assert config.regime == "loop", config
    if chunk:
        # As the planner would plan a loop_chunk of ``chunk`` (planner.select_config).
        tuning = tuning_for(record)
        config = dataclasses.replace(config, block_n=chunk,
                                     num_warps=_warps(chunk, tuning.elements_per_thread, record, tuning.max_warps))
    spec = variant_spec(target, record, config, case)
    spec["constexprs"].update(FORMS[form] or {})
    compiled, *_ = compiled_variant(spec)
    if target.backend == "cuda":
        loops = machine_code.sass_loops(cubin_sass(compiled.asm["cubin"]))
        usage = cubin_resources(compiled.asm["cubin"], compiled.metadata.name)
        registers, spills = usage["REG"], (usage.get("LOCAL", 0) + usage.get("STACK", 0)) // 4
    else:
        loops = machine_code.amdgcn_loops(compiled.asm["amdgcn"])
        usage = amdgcn_resources(compiled.asm["amdgcn"])
        registers, spills = usage["vgpr_count"], usage.get("private_segment_fixed_size", 0) // 4
    per_thread = config.block_m * config.block_n // (config.num_warps * target.warp_size)
    # The statistics pass, then the output pass: the innermost loops in address order (a called
    # function's, the 64-bit division's on sm_90, hold none).
    counted = [loop_counts(loop) for loop in sorted(machine_code.innermost(loops), key=lambda loop: loop.head)]
    passes = [{**counts, "per_element": round(counts["instructions"] / per_thread, 2)} for counts, _ in counted]
    top = counted[0][1].most_common(10) if counted else []
    return {"target": target_text, "shape": shape + (" sliced" if sliced else ""), "dtype": dtype, "form": form,
            "block_n": config.block_n,
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
    parser.add_argument("--form", action="append", choices=list(FORMS),
                        help="repeatable (default plain and fused)")
    parser.add_argument("--chunk", type=int, default=0,
                        help="BLOCK_N (a loop_chunk) instead of the plan's, warps as planned for it (0: the plan's)")
    parser.add_argument("--sliced", action="store_true",
                        help="rows sliced from a vocabulary padded to 64, written contiguous (plain form only)")
    parser.add_argument("--json", help="also write every count here")
    args = parser.parse_args()
    print("| target | shape | dtype | form | BLOCK_N | warps | elts/thread | regs / spills | stats loop (per elt) "
          "| stats bar / shfl / smem | output loop (per elt) | output bar / shfl / smem | stats top opcodes |")
    print("|" + "---|" * 13)
    found_all = []
    for target in args.target or TARGETS:
        for shape in args.shape or SHAPES:
            for dtype in args.dtype or DTYPES:
                for form in args.form or ("plain", "fused"):
                    found = measure(target, shape, dtype, form, args.chunk, args.sliced)
                    found_all.append(found)
                    print(_row(found), flush=True)
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(found_all, handle, indent=1)


if __name__ == "__main__":
    main()
