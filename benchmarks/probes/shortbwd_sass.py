"""Why FlagGems' softmax backward led ours on short rows (issue 34 item 9, NOTES v33): both kernels
cross-compiled for sm_90 here and their SASS compared, per case of ``benchmarks/shortbwd.py``.

Ours: the plan the H100's first call takes (``launch_plan.plan_softmax`` from the package's
resource table of this Triton, each launched variant cross-compiled, as a first call compiles it),
under a tuning row of ``shortbwd.VARIANTS``. FlagGems': ``softmax_backward_kernel_inner`` read
from its wheel at run time (its decorators dropped; not part of this repository) with the
configuration its autotuner chose on the H100 (TILE_N 256 for rows of 256, else 1024; TILE_M =
1024 / TILE_N; 4 warps).

    PYTHONPATH=/tmp/triton36:. python benchmarks/probes/shortbwd_sass.py [--variant base ...]
        [--wheel .whl/flag_gems-5.0.2-py3-none-any.whl] [--dump DIR]

Columns: tile (rows x columns, warps), registers, programs an SM (``target.occupancy``), the
grid, SASS instructions (static) and per element a thread holds, where the first load stands
(instructions before it: the address math and, in our general form, the group division), the
loads' and stores' widths, mask compares (ISETP) and predicates moved to registers (P2R: more
masks than predicate registers), the reduction's shuffles and barriers, and loads with an
eviction hint (EF/EL).
"""
from __future__ import annotations

import argparse
import ast
import collections
import dataclasses
import functools
import importlib.util
import os
import re
import sys
import tempfile
import zipfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.dirname(HERE)]

from loss_instructions import sass_counts  # noqa: E402
import shortbwd  # noqa: E402

from portable_softmax import compat, kernel_resources, tuning  # noqa: E402
from portable_softmax.crosscompile import Case, cubin_resources, cubin_sass, launch_arguments  # noqa: E402
from portable_softmax.crosscompile.compiling import compiled_variant  # noqa: E402
from portable_softmax.launch_plan import RowView, known_resources, plan_softmax, softmax_call  # noqa: E402
from portable_softmax.profiles import profile_record  # noqa: E402
from portable_softmax.record import KernelResources  # noqa: E402
from portable_softmax.targets import target_for  # noqa: E402

POINTERS = {"bfloat16": "*bf16", "float32": "*fp32"}
WHEEL = os.path.join(os.path.dirname(os.path.dirname(HERE)), ".whl", "flag_gems-5.0.2-py3-none-any.whl")


def gems_kernel(wheel: str):
    """FlagGems' backward kernel, compiled from its wheel's source with its decorators dropped."""
    with zipfile.ZipFile(wheel) as archive:
        source = archive.read("flag_gems/ops/softmax.py").decode()
    node = next(n for n in ast.parse(source).body
                if isinstance(n, ast.FunctionDef) and n.name == "softmax_backward_kernel_inner")
    node.decorator_list = []
    text = ("import triton\nimport triton.language as tl\n\n\n@triton.jit\n"
            + ast.unparse(node).replace("tle.program_id", "tl.program_id") + "\n")
    path = os.path.join(tempfile.mkdtemp(), "gems_softmax_backward.py")  # Triton reads the source from a file
    with open(path, "w") as handle:
        handle.write(text)
    spec = importlib.util.spec_from_file_location("gems_softmax_backward", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.softmax_backward_kernel_inner


def summary(cubin: bytes, name: str, per_thread: int) -> tuple[dict, str]:
    sass = cubin_sass(cubin)
    ops, _ = sass_counts(sass)
    lines = [m.group(0) for m in re.finditer(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?P\w+\s+)?[A-Z][A-Z0-9_.]*", sass)]
    first = next((i for i, line in enumerate(lines) if "LDG" in line), -1)
    widths = collections.Counter(re.sub(r".*?([LS][DT]G[A-Z0-9_.]*)$", r"\1", line) for line in lines
                                 if re.search(r"\b[LS][DT]G\.", line))
    usage = cubin_resources(cubin, name)
    total = sum(ops.values())
    return {"regs": usage["REG"], "instr": total, "per_elt": round(total / per_thread, 1), "first_ldg": first,
            "mem": " ".join(f"{k} {v}" for k, v in sorted(widths.items())), "ISETP": ops["ISETP"], "P2R": ops["P2R"],
            "SHFL": ops["SHFL"], "BAR": ops["BAR"], "div": "yes" if ops["MUFU"] and ops["I2F"] else "no",
            "hints": sum(v for k, v in widths.items() if ".EF" in k or ".EL" in k)}, sass


@functools.lru_cache(maxsize=None)
def _compiled(kernel: str, args: tuple, constexprs: tuple, options: tuple):
    spec = {"target": ["cuda", 90, 32], "kernel": kernel, "args": [list(a) for a in args],
            "constexprs": dict(constexprs), "options": dict(options)}
    compiled, *_ = compiled_variant(spec)
    return compiled


def ours(variant: str, rows: int, cols: int, dtype: str) -> tuple[str, dict, str]:
    """Our launched backward for the case under ``variant``, planned as the H100's first call."""
    record = profile_record("h100")
    key = (record.backend, record.name)
    saved = tuning.TUNING.pop(key, None)
    tuning.TUNING[key] = dataclasses.replace(tuning.tuning_for(record), **shortbwd.VARIANTS[variant])
    try:
        target = target_for(record)
        size = 2 if dtype == "bfloat16" else 4
        call = softmax_call(target, "backward", RowView(1, rows, cols, ((0, cols, 1),) * 3), [size] * 3, True,
                            False, False)
        case = Case(rows, cols, dtype, True, False)

        def compile(variant_):
            _, args, _ = launch_arguments(variant_.config, case)
            compiled = _compiled(variant_.kernel, tuple(map(tuple, args)), variant_.constexprs, variant_.options)
            usage = cubin_resources(compiled.asm["cubin"], compiled.metadata.name)
            return KernelResources(registers=usage["REG"], shared_memory=int(compiled.metadata.shared),
                                   num_warps=variant_.option_values["num_warps"],
                                   spills=(usage.get("LOCAL", 0) + usage.get("STACK", 0)) // 4)

        import triton

        table = kernel_resources.table_for("cuda", "sm_90", triton.__version__)
        plan, (launched,) = plan_softmax(target, call, known_resources(target, table, dtype, True, call.input_bytes),
                                         compile)
        _, args, _ = launch_arguments(launched.config, case)
        compiled = _compiled(launched.kernel, tuple(map(tuple, args)), launched.constexprs, launched.options)
        found, sass = summary(compiled.asm["cubin"], compiled.metadata.name,
                              plan.block_m * plan.block_n // (32 * plan.num_warps))
        cap = launched.option_values.get("maxnreg")
        form = " dense" if plan.dense else " flat" if plan.flat else ""
        found.update(occ=plan.occupancy, grid=plan.programs)
        return f"{plan.block_m}x{plan.block_n} w{plan.num_warps}{form}{f' cap{cap}' if cap else ''}", found, sass
    finally:
        tuning.TUNING.pop(key, None)
        if saved is not None:
            tuning.TUNING[key] = saved


def gems(kernel, rows: int, cols: int, dtype: str) -> tuple[str, dict, str]:
    """FlagGems' backward with the H100 autotuner's choice for the case."""
    import triton
    from triton.backends.compiler import GPUTarget

    tile_n = 256 if cols <= 256 else 1024
    tile_m = max(1, 1024 // tile_n)
    signature = {"out_ptr": POINTERS[dtype], "out_grad_ptr": POINTERS[dtype], "in_grad_ptr": POINTERS[dtype],
                 "M": "i32", "N": "i32", "TILE_M": "constexpr", "TILE_N": "constexpr", "ONE_TILE_PER_CTA": "constexpr"}
    constexprs = {"TILE_M": tile_m, "TILE_N": tile_n, "ONE_TILE_PER_CTA": tile_n >= cols}
    # As Triton's launch specialises: aligned pointers, integers divisible by 16.
    divisible = ["out_ptr", "out_grad_ptr", "in_grad_ptr"] + [n for n, v in (("M", rows), ("N", cols)) if v % 16 == 0]
    compiled = triton.compile(compat.ast_source(kernel, signature, constexprs, divisible),
                              target=GPUTarget("cuda", 90, 32), options={"num_warps": 4, "num_stages": 3})
    found, sass = summary(compiled.asm["cubin"], compiled.metadata.name, tile_m * tile_n // 128)
    record = profile_record("h100")
    used = KernelResources(registers=found["regs"], shared_memory=int(compiled.metadata.shared), num_warps=4)
    found.update(occ=target_for(record).occupancy(record, used), grid=-(-rows // tile_m))
    return f"{tile_m}x{tile_n} w4", found, sass


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--variant", action="append", help="our tuning rows (shortbwd.VARIANTS; default base)")
    parser.add_argument("--wheel", default=WHEEL, help="FlagGems' wheel (its kernel is read from it)")
    parser.add_argument("--dump", help="write each kernel's SASS here")
    args = parser.parse_args()
    kernel = gems_kernel(args.wheel) if os.path.exists(args.wheel) else None
    columns = ["regs", "occ", "grid", "instr", "per_elt", "first_ldg", "mem", "ISETP", "P2R", "SHFL", "BAR", "div",
               "hints"]
    print("| case | impl | tile | " + " | ".join(columns) + " |")
    print("|" + "---|" * (3 + len(columns)))
    for dtype in ("bfloat16", "float32"):
        for rows, cols in shortbwd.CASES:
            found = [(f"ours {name}", *ours(name, rows, cols, dtype)) for name in args.variant or ["base"]]
            if kernel is not None:
                found.append(("flaggems", *gems(kernel, rows, cols, dtype)))
            for impl, tile, row, sass in found:
                print(f"| {rows}x{cols} {dtype} | {impl} | {tile} | " + " | ".join(str(row[c]) for c in columns)
                      + " |", flush=True)
                if args.dump:
                    os.makedirs(args.dump, exist_ok=True)
                    with open(os.path.join(args.dump, f"{rows}x{cols}_{dtype}_{impl.replace(' ', '_')}.sass"),
                              "w") as handle:
                        handle.write(sass)


if __name__ == "__main__":
    main()
