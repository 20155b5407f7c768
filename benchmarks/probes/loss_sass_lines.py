"""Where the split gradient form's item loop spends its sm_90 instructions, by source line: each
instruction of the loop a persistent program runs once an item (and of the functions it calls
there) attributed, through the line information Triton writes and ``nvdisasm -gi`` prints with its
inlined call sites, to the kernel's statement that holds it and to the innermost source line
(issue 32, NOTES v35). Cross-compiled here (no GPU), as ``loss_instructions.py`` builds a variant.

    PYTHONPATH=. python benchmarks/probes/loss_sass_lines.py [--shape 8192x128256] [--dtype bfloat16]
        [--role grad] [--maxnreg 128] [--top 30] [--json OUT.json] [--listing OUT.txt]

Fixed and per-element costs: the variant is compiled twice, at its warps (64 elements a thread for
bf16 chunks of 8192 at 4 warps) and at twice its warps (half the elements a thread, the same
constexprs), and each line's counts n1, n2 fitted as fixed + per_elt x elements: per_elt = (n1 -
n2) / (e1 - e2). The doubled warps change the cross-warp reductions a little (more partials in
shared memory): a fixed cost of a few instructions may read as a fraction of one an element, and
ptxas may treat a line differently at the two sizes (main's select of an ignored row's zeros: 132
instructions at 64 elements a thread, 33 at 32), which no fit of two points can tell.
Counts are static: a called wait loop runs as many trips as it waits. NOPs (a function's
alignment padding after its last branch) are left out.
"""
from __future__ import annotations

import argparse
import ast
import collections
import functools
import json
import os
import re

from portable_softmax import kernels
from portable_softmax.crosscompile import (Case, compiled_variant, cubin_resources, cubin_sass, parse_target,
                                           target_record)
from portable_softmax.crosscompile.cases import loss_configs, variant_spec

SOURCE = re.compile(r'//## File "([^"]+)", line (\d+)')
INSTRUCTION = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)[^;]*;")
LABEL = re.compile(r"^(\.L_x_\d+):")
BRANCH = re.compile(r"BRA\s+`?\(?(\.L_x_\d+)")
FUNCTION = re.compile(r"\.type\s+(\S+),@function")
# A called function's mangled name: $kernel$portable_softmax_$_kernels_$_module_$__function__<types>...
CALLED = re.compile(r"_\$_([a-z0-9_]+?)_\$_(_[a-z0-9_]+?)__")
KERNELS = os.path.dirname(kernels.__file__)


def parse(sass: str) -> tuple[dict[str, list[tuple[str, tuple]]], list[tuple[str, int, int]]]:
    """Each function's instructions in order, (opcode, chain of (file, line, path), innermost
    first), and each backward branch's loop: (function, first instruction, one past the branch)."""
    functions: dict[str, list[tuple[str, tuple]]] = {}
    current: list = []
    chain: tuple = ()
    block: list = []
    labels: dict[str, int] = {}
    loops = []
    name = ""
    for line in sass.splitlines():
        found = FUNCTION.search(line)
        if found:
            called = CALLED.search(found.group(1))
            name = f"{called.group(1)}.{called.group(2)}" if called else found.group(1)
            current = functions.setdefault(name, [])
            continue
        source = SOURCE.search(line)
        if source:
            block.append((os.path.basename(source.group(1)), int(source.group(2)), source.group(1)))
            continue
        if block:
            chain, block = tuple(block), []
        label = LABEL.match(line)
        if label:
            labels[label.group(1)] = len(current)
            continue
        found = INSTRUCTION.search(line)
        if found and found.group(2) != "NOP":
            current.append((found.group(2), chain))
            target = BRANCH.search(line)
            if found.group(2) == "BRA" and target and labels.get(target.group(1), len(current)) < len(current):
                loops.append((name, labels[target.group(1)], len(current)))
    return functions, loops


def item_loop(sass: str) -> tuple[list, dict[str, list]]:
    """The kernel's largest loop (a persistent program's item loop) and the functions it calls."""
    functions, loops = parse(sass)
    kernel = next(iter(functions))
    _, start, end = max((loop for loop in loops if loop[0] == kernel), key=lambda loop: loop[2] - loop[1])
    return functions[kernel][start:end], {name: code for name, code in functions.items() if name != kernel}


@functools.lru_cache(maxsize=None)
def _defs(path: str) -> list[tuple[int, int, str]]:
    """(first, last, name) of each function in a source file, innermost last."""
    with open(path) as handle:
        tree = ast.parse(handle.read())
    return sorted((node.lineno, node.end_lineno, node.name) for node in ast.walk(tree)
                  if isinstance(node, ast.FunctionDef))


def _path(frame: tuple) -> str:
    """The frame's file: this checkout's kernels module of that name (a cached binary names the
    checkout that compiled it first), else the path the line information gives."""
    local = os.path.join(KERNELS, frame[0])
    return local if os.path.exists(local) else frame[2]


def describe(frame: tuple) -> str:
    """``file:line function `statement```."""
    path = _path(frame)
    if not os.path.exists(path):
        return f"{frame[0]}:{frame[1]}"
    name = next((name for first, last, name in reversed(_defs(path)) if first <= frame[1] <= last), "?")
    with open(path) as handle:
        text = handle.read().splitlines()[frame[1] - 1].strip()
    return f"{frame[0]}:{frame[1]} {name} `{text[:60]}`"


def attribute(loop: list, called: dict[str, list]) -> dict[str, collections.Counter]:
    """Counts of each key: ``statement`` (the kernel's outermost frame, or the called function),
    ``leaf`` (the innermost frame), each a Counter of opcode counts under ``key``."""
    found: dict[str, dict] = {"statement": collections.defaultdict(collections.Counter),
                              "leaf": collections.defaultdict(collections.Counter)}
    for owner, code in [("", loop)] + [(f"called {name}", body) for name, body in called.items()]:
        for op, chain in code:
            outer = owner or (describe(chain[-1]) if chain else "(no line)")
            found["statement"][outer][op] += 1
            found["leaf"][(f"[{owner}] " if owner else "") + (describe(chain[0]) if chain else "(no line)")][op] += 1
    return found


def compile_loop(spec: dict) -> tuple[list, dict[str, list], dict]:
    """The item loop, the functions it calls and the resources of one variant."""
    compiled, *_ = compiled_variant(spec)
    loop, called = item_loop(cubin_sass(compiled.asm["cubin"], inlined=True))
    return loop, called, cubin_resources(compiled.asm["cubin"], compiled.metadata.name)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", default="cuda:90=h200")
    parser.add_argument("--shape", default="8192x128256")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--role", default="grad", help="as the compile report names it")
    parser.add_argument("--maxnreg", type=int, default=128, help="register cap (0: none)")
    parser.add_argument("--top", type=int, default=30, help="rows of the leaf table")
    parser.add_argument("--json", help="also write the counts here")
    parser.add_argument("--listing", help="also write the loop here, an instruction a line with its innermost "
                                          "source line and the kernel's statement")
    args = parser.parse_args()
    target = parse_target(args.target)
    record, _, _ = target_record(target)
    rows, cols = (int(n) for n in args.shape.split("x"))
    case = Case(rows, cols, args.dtype, False, False, loss=True)
    spec = next(variant_spec(target, record, config, case, role) for role, config in loss_configs(record, case)
                if role == args.role)
    if args.maxnreg:
        spec["options"]["maxnreg"] = args.maxnreg
    warps = spec["options"]["num_warps"]
    elements = [spec["constexprs"]["BLOCK_N"] // (w * 32) for w in (warps, 2 * warps)]
    counted = []
    for w in (warps, 2 * warps):
        loop, called, usage = compile_loop(dict(spec, options=dict(spec["options"], num_warps=w)))
        counted.append(attribute(loop, called))
        if args.listing and w == warps:
            with open(args.listing, "w") as handle:
                handle.writelines(f"{op:8s} {describe(chain[0]) if chain else '-'} < {chain[-1][1] if chain else '-'}\n"
                                  for op, chain in loop)
        print(f"{w} warps, {elements[len(counted) - 1]} elements a thread: item loop {len(loop)}, called "
              f"{ {name: len(body) for name, body in called.items()} }, registers {usage['REG']}, spills "
              f"{(usage.get('LOCAL', 0) + usage.get('STACK', 0)) // 4}")
    span = elements[0] - elements[1]
    out = {}
    for kind in ("statement", "leaf"):
        keys = sorted(counted[0][kind], key=lambda key: -sum(counted[0][kind][key].values()))
        print(f"\n| {kind} | {elements[0]} a thread | {elements[1]} a thread | per elt | fixed | top opcodes |")
        print("|---|---|---|---|---|---|")
        total = [0, 0]
        out[kind] = []
        for key in keys[:args.top] if kind == "leaf" else keys:
            n1, n2 = (sum(c[kind].get(key, collections.Counter()).values()) for c in counted)
            per = (n1 - n2) / span
            ops = " ".join(f"{op} {n}" for op, n in counted[0][kind][key].most_common(6))
            print(f"| {key} | {n1} | {n2} | {per:.2f} | {n1 - per * elements[0]:.0f} | {ops} |")
            out[kind].append({"key": key, "n": [n1, n2], "ops": dict(counted[0][kind][key])})
        for i in (0, 1):
            total[i] = sum(sum(c.values()) for c in counted[i][kind].values())
        print(f"| all | {total[0]} | {total[1]} | {(total[0] - total[1]) / span:.2f} | "
              f"{total[0] - (total[0] - total[1]) / span * elements[0]:.0f} | |")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(out, handle, indent=1)


if __name__ == "__main__":
    main()
