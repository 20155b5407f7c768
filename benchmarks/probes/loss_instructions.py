"""How many sm_90 instructions the cross-entropy kernels issue per element, and their registers: the
split forward with the gradient (every split form the plan picks between), the forward alone (by
arrival and its alternatives), the tile and loop forms and the streamed backward, bf16 and
float32, cross-compiled here with this machine's Triton and disassembled with its bundled
nvdisasm (no GPU; issue 32, NOTES v31 "bf16 is issue-bound on the H200").

    PYTHONPATH=. python benchmarks/probes/loss_instructions.py [--shape 8192x128256 ...]
        [--dtype bfloat16 ...] [--role "grad" ...] [--options] [--top 12] [--json OUT.json]

Counts are static: the instructions of the kernel's binary, not of its execution. In the split and
tile forms a program's body runs once per item with every element in registers, so the count over
elements a thread (``per elt``) is what the hot path issues per element, plus the fixed cost of an
item. A loop form's body runs once per streamed block: its count is per block, not per row.
Registers are cuobjdump's, uncapped (the launch caps them with ``maxnreg``; ``--maxnreg`` asks
for that cap here), spills its stack and local bytes / 4, as the compile report gives them.
"""
from __future__ import annotations

import argparse
import collections
import json
import re

from portable_softmax.crosscompile import (Case, compiled_variant, cubin_resources, cubin_sass, parse_target,
                                           target_record)
from portable_softmax.crosscompile.cases import loss_configs, variant_spec

# Long rows split without windows, odd rows split through windows, short rows on tiles.
SHAPES = ("8192x128256", "4096x50257", "16384x4096")
DTYPES = ("bfloat16", "float32")
SASS_LINE = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)([^;]*)")
SASS_LABEL = re.compile(r"^(\.L_x_\d+):")
# Backward branches spanning fewer instructions are wait loops (the exchange's), not a body.
MIN_LOOP = 40


def sass_counts(sass: str) -> tuple[collections.Counter, list[int]]:
    """Each opcode's count in ``sass`` (modifiers dropped: ``FMUL.FTZ`` is ``FMUL``), and the
    instructions of each loop, largest first (from a backward branch's target to the branch,
    nested loops within): a persistent program's item loop runs once an item where the rest runs
    once a program (a pipelined loop's prologue, the set-up); a streamed row's column loops once a
    block."""
    ops: collections.Counter = collections.Counter()
    labels: dict[str, int] = {}
    branches: list[tuple[int, str]] = []
    pending = []
    for line in sass.splitlines():
        label = SASS_LABEL.match(line)
        if label:
            pending.append(label.group(1))
            continue
        found = SASS_LINE.search(line)
        if not found:
            continue
        index = sum(ops.values())
        ops[found.group(2)] += 1
        labels.update((name, index) for name in pending)
        pending = []
        target = re.search(r"(\.L_x_\d+)", found.group(3))
        if found.group(2) == "BRA" and target:
            branches.append((index, target.group(1)))
    spans = [index - labels[name] + 1 for index, name in branches if labels.get(name, index + 1) <= index]
    return ops, sorted((span for span in spans if span >= MIN_LOOP), reverse=True)


def measure(target: object, record: object, case: Case, role: str, config: object, maxnreg: int) -> dict:
    """One variant's label, instruction counts and registers."""
    spec = variant_spec(target, record, config, case, role)
    if maxnreg:
        spec["options"]["maxnreg"] = maxnreg
    compiled, *_ = compiled_variant(spec)
    ops, loop = sass_counts(cubin_sass(compiled.asm["cubin"]))
    usage = cubin_resources(compiled.asm["cubin"], compiled.metadata.name)
    k = spec["constexprs"]
    warps = spec["options"]["num_warps"]
    per_thread = k["BLOCK_M"] * k["BLOCK_N"] // (warps * 32)
    backward = " (backward)" if case.backward else ""
    return {"shape": f"{case.rows}x{case.cols}", "dtype": case.dtype, "role": role + backward, "kernel": spec["kernel"],
            "block_n": k["BLOCK_N"], "warps": warps, "maxnreg": maxnreg, "stages": spec["options"]["num_stages"],
            "align": k.get("ALIGN", 1), "per_thread": per_thread, "instructions": sum(ops.values()),
            "per_element": round(sum(ops.values()) / per_thread, 2), "loop": loop, "registers": usage["REG"],
            "spills": (usage.get("LOCAL", 0) + usage.get("STACK", 0)) // 4, "ops": dict(ops.most_common())}


def _row(found: dict, top: int) -> str:
    """One markdown row of ``measure``'s result (a role's " | " written " / ")."""
    cells = [found["shape"], found["dtype"], found["role"].replace(" | ", " / "),
             found["kernel"].replace("cross_entropy_", ""), found["block_n"], found["warps"], found["stages"],
             found["align"], found["maxnreg"] or "-", found["per_thread"], found["instructions"],
             found["per_element"], " ".join(map(str, found["loop"])) or "-", found["registers"], found["spills"],
             " ".join(f"{op} {n}" for op, n in list(found["ops"].items())[:top])]
    return "| " + " | ".join(map(str, cells)) + " |"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", default="cuda:90", help="a cuda target, as `portable-softmax compile` takes it")
    parser.add_argument("--shape", action="append", help=f"loss shape ROWSxCOLS, repeatable (default {SHAPES})")
    parser.add_argument("--dtype", action="append", help=f"repeatable (default {DTYPES})")
    parser.add_argument("--role", action="append",
                        help="only these roles (exact, as the compile report names them: 'grad', 'no grad', "
                             "'grad | loop', ...); default every role")
    parser.add_argument("--options", action="store_true", help="also the forms with every option (', all')")
    parser.add_argument("--backward", action="store_true", help="also the streamed backward kernel")
    parser.add_argument("--maxnreg", type=int, action="append",
                        help="compile under this register cap (0: none), repeatable: a row each (default none)")
    parser.add_argument("--top", type=int, default=12, help="opcodes listed per variant")
    parser.add_argument("--json", help="also write every count here")
    args = parser.parse_args()
    target = parse_target(args.target)
    record, _, _ = target_record(target)
    rows_out = []
    print("| shape | dtype | role | kernel | BLOCK_N | warps | stages | align | maxnreg | elts/thread "
          "| instructions | per elt | loops | regs | spills | top opcodes |")
    print("|" + "---|" * 16)
    for shape in args.shape or SHAPES:
        rows, cols = (int(n) for n in shape.split("x"))
        for dtype in args.dtype or DTYPES:
            for backward in (False, True) if args.backward else (False,):
                case = Case(rows, cols, dtype, backward, False, loss=True)
                for role, config in loss_configs(record, case):
                    if (args.role and role not in args.role) or (", all" in role and not args.options):
                        continue
                    for cap in args.maxnreg or [0]:
                        found = measure(target, record, case, role, config, cap)
                        rows_out.append(found)
                        print(_row(found, args.top), flush=True)
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(rows_out, handle, indent=1)


if __name__ == "__main__":
    main()
