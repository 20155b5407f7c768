"""The machine code of every planned kernel for a few cases, unfused, as opcode sequences per
(target, kernel, constexprs, options): SASS for cuda:90, AMDGCN for gfx942, compiled here without a
GPU. Run in two checkouts and compare the JSON files to show that a change leaves the plain
kernels' code as it was (NOTES v17: the fused arguments added to the split and loop kernels).

    python benchmarks/opcodes.py OUT.json            # in each checkout
    python benchmarks/opcodes.py --compare A.json B.json
"""
from __future__ import annotations

import json
import re
import sys

from portable_softmax import crosscompile

TARGETS = ("cuda:90", "hip:gfx942")
# Tiles (short, many, wide), split rows (aligned, odd, pipelined), a column (tiles of rows split).
CASES = crosscompile.cases_for(
    [(32768, 256), (16384, 2048), (64, 8192), (64, 65536), (64, 50257), (4096, 393216), (4096, 50257)],
    ["bfloat16", "float32"], [False, True], [(1024, 32768)])
FUSED_CONSTEXPRS = ("SCALE", "MASK", "CAUSAL")
SASS_OPCODE = re.compile(r"/\*[0-9a-f]{4}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)")


def _opcodes(target: str, compiled: object) -> list[str]:
    if target.startswith("cuda"):
        return SASS_OPCODE.findall(crosscompile.cubin_sass(compiled.asm["cubin"]))
    return [line.split()[0] for line in compiled.asm["amdgcn"].splitlines()
            if line.startswith("\t") and line.strip() and not line.strip().startswith((".", ";"))]


def dump(path: str) -> None:
    out: dict[str, dict] = {}
    for name in TARGETS:
        target = crosscompile.parse_target(name)
        record, _, _ = crosscompile.target_record(target)
        for case in CASES:
            for role, config in crosscompile.case_configs(record, case):
                spec = crosscompile.variant_spec(target, record, config, case, role)
                plain = {k: v for k, v in spec["constexprs"].items() if k not in FUSED_CONSTEXPRS}
                key = f"{name} {spec['kernel']} {sorted(plain.items())} {spec['options']}"
                if key not in out:
                    ops = _opcodes(name, crosscompile.compiled_variant(spec)[0])
                    out[key] = {"n": len(ops), "ops": ops}
                    print(key[:150], len(ops), flush=True)
    with open(path, "w") as handle:
        json.dump(out, handle)


def compare(first: str, second: str) -> int:
    with open(first) as a_file, open(second) as b_file:
        a, b = json.load(a_file), json.load(b_file)
    differ = sorted(k for k in set(a) | set(b) if a.get(k, {}).get("ops") != b.get(k, {}).get("ops"))
    for key in differ:
        print("differs:", key)
    print(f"{len(set(a) | set(b)) - len(differ)} variants with the same opcodes, {len(differ)} differ")
    return 1 if differ else 0


if __name__ == "__main__":
    if sys.argv[1] == "--compare":
        sys.exit(compare(sys.argv[2], sys.argv[3]))
    dump(sys.argv[1])
