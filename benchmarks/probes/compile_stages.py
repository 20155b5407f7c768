"""Where a cold first call's compile time goes, stage by stage (issue 34 item 4), on any machine.

The variants a case's first call compiles are found as ``first_call_compiles.py`` finds them (the
H100's record, launches stubbed); each is then compiled for sm_90 ``--repeat`` times in this
process with Triton's cache bypassed, timed per stage by Triton's compilation listener (``ast``:
the Python source to TTIR; then ttir, ttgir, llir, ptx, cubin), best of the repeats. Besides
the kernels, what a cold process also builds with gcc: Triton's ``cuda_utils`` module (once per
cache, every first call pays it, Liger's too) and, on Triton releases that build one (3.6), the
C launcher of each distinct signature. A reference kernel (Triton's tutorial softmax, a few
dozen lines) at Liger's tile for a row of 50257 (65536 columns, 32 warps) and at ours (4096
columns, 2 warps) shows the floor. Run with ``PYTHONPATH`` at a Triton 3.6 target
(``pip install --target /tmp/t36 triton==3.6.0``) to see the H100 run's release.

    PYTHONPATH=.[:/tmp/t36] python benchmarks/probes/compile_stages.py [--case NAME ...] [--repeat N]
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import first_call_compiles as found  # noqa: E402  (sets the environment: no interpreter, an empty cache)

import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from triton import knobs  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402

from portable_softmax import compat  # noqa: E402
from portable_softmax.crosscompile.compiling import compile_variant, compiled_variant  # noqa: E402


@triton.jit
def tutorial_softmax(output_ptr, input_ptr, input_row_stride, output_row_stride, n_rows, n_cols,
                     BLOCK_SIZE: tl.constexpr):
    # Triton's tutorial 02 (fused softmax), without its pipelining hint: the reference.
    for row_idx in tl.range(tl.program_id(0), n_rows, tl.num_programs(0)):
        row_start_ptr = input_ptr + row_idx * input_row_stride
        col_offsets = tl.arange(0, BLOCK_SIZE)
        mask = col_offsets < n_cols
        row = tl.load(row_start_ptr + col_offsets, mask=mask, other=-float("inf")).to(tl.float32)
        row_minus_max = row - tl.max(row, axis=0)
        numerator = tl.exp(row_minus_max)
        softmax_output = numerator / tl.sum(numerator, axis=0)
        output_row_start_ptr = output_ptr + row_idx * output_row_stride
        tl.store(output_row_start_ptr + col_offsets, softmax_output.to(tl.bfloat16), mask=mask)


REFERENCES = {"tutorial softmax 65536 cols, 32 warps (Liger's tile)": (65536, 32),
              "tutorial softmax 4096 cols, 2 warps (our chunk)": (4096, 2)}


STAGES = ("ast", "ttir", "ttgir", "llir", "ptx", "cubin", "total", "first")


class Specs(found.Counter):
    """The variants a first call compiles, kept as specs (compiled once, for their resources)."""

    def __init__(self) -> None:
        super().__init__()
        self.specs: list[dict[str, Any]] = []

    def compile(self, kernel: Any, args: tuple, constexprs: dict, options: dict, why: str) -> dict[str, Any]:
        self.specs.append({"target": found.TARGET, "kernel": kernel.fn.__name__,
                           "args": [found._arg(a) for a in args], "constexprs": dict(constexprs),
                           "options": dict(options)})
        return super().compile(kernel, args, constexprs, options, why)


def timed(build: Any, repeat: int) -> tuple[dict[str, float], Any]:
    """Stage seconds of ``build()`` (a ``triton.compile``), best of ``repeat``, and ``first``: the
    first run's total; and its result."""
    best: dict[str, float] = {}
    first = None
    result = None
    knobs.compilation.always_compile = True
    try:
        for _ in range(repeat):
            times: list[Any] = []
            knobs.compilation.listener = lambda **kw: times.append(kw["times"])
            started = time.perf_counter()
            result = build()
            total = time.perf_counter() - started
            first = total if first is None else first
            stages = {"ast": times[0].ir_initialization / 1e6,
                      **{name: us / 1e6 for name, us in times[0].lowering_stages}, "total": total}
            for name, seconds in stages.items():
                best[name] = min(best.get(name, float("inf")), seconds)
    finally:
        knobs.compilation.listener = None
        knobs.compilation.always_compile = False
    return {**best, "first": first}, result


def launcher_seconds(compiled: Any) -> tuple[float, int] | None:
    """gcc's time for the C launcher of ``compiled``'s signature, and its source's lines; None
    where this Triton builds none (a generic launcher)."""
    from triton.backends.nvidia import driver

    if not hasattr(driver, "make_launcher"):
        return None
    src = compiled.src
    arg_idx = lambda x: (src.fn.arg_names.index(x), ) if isinstance(x, str) else x  # noqa: E731 (as CudaLauncher)
    constants = {arg_idx(k): v for k, v in src.constants.items()}
    source = driver.make_launcher(constants, dict(src.signature), getattr(compiled.metadata, "tensordesc_meta", None))
    return _gcc(source, "__triton_launcher"), source.count("\n")


def utils_seconds() -> float:
    """gcc's time for Triton's ``cuda_utils`` (driver.c), built once per cache by the first call."""
    from triton.backends.nvidia import driver

    with open(os.path.join(driver.dirname, "driver.c")) as handle:
        return _gcc(handle.read(), "cuda_utils")


def _gcc(source: str, name: str) -> float:
    """Build ``source`` as Triton's ``_build`` does (without libcuda, which this machine lacks:
    a shared object may leave its symbols unresolved)."""
    from triton.backends.nvidia import driver
    from triton.runtime.build import _build

    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, name + ".c")
        with open(path, "w") as handle:
            handle.write(source)
        started = time.perf_counter()
        _build(name, path, folder, [driver.libdevice_dir], list(driver.include_dirs), [], [])
        return time.perf_counter() - started


def _row(label: str, stages: dict[str, float], extra: str = "") -> str:
    return f"  {label:<60} " + " ".join(f"{stages.get(n, 0.0):6.3f}" for n in STAGES) + f"  {extra}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--case", action="append", choices=sorted(found.CASES))
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    print(f"triton {triton.__version__}: seconds per stage for sm_90, best of {args.repeat}, this machine's CPU")
    print(f"  {'':<60} " + " ".join(f"{n:>6}" for n in STAGES))
    from triton.runtime.cache import triton_key

    started = time.perf_counter()
    triton_key()  # hashes Triton's own files, once per process: every process's first compile (or cache hit)
    print(f"  once per process: triton_key {time.perf_counter() - started:.2f} s")
    target = GPUTarget(*found.TARGET)
    for label, (block, warps) in REFERENCES.items():
        signature = {"output_ptr": "*bf16", "input_ptr": "*bf16", "input_row_stride": "i32",
                     "output_row_stride": "i32", "n_rows": "i32", "n_cols": "i32", "BLOCK_SIZE": "constexpr"}
        source = compat.ast_source(tutorial_softmax, signature, {"BLOCK_SIZE": block},
                                   ["output_ptr", "input_ptr", "input_row_stride", "output_row_stride"])
        stages, compiled = timed(lambda: triton.compile(source, target=target, options={"num_warps": warps}),
                                 args.repeat)
        print(_row(label, stages, f"{compiled.metadata.name}"), flush=True)
    launchers: dict[str, float] = {}
    for name in args.case or found.CASES:
        specs = Specs()
        found.install(specs)
        found.CASES[name]()
        print(f"{name}:")
        for spec in specs.specs:
            resources = compile_variant(spec)
            stages, (compiled, *_) = timed(lambda: compiled_variant(spec), args.repeat)
            launcher = launcher_seconds(compiled)
            text = "" if launcher is None else f"launcher gcc {launcher[0]:.2f} s ({launcher[1]} lines)"
            key = compiled.asm.get("ptx", "").count("\n")
            print(_row(spec["kernel"], stages, f"regs {resources['registers']} spills {resources['spills']} "
                                               f"ptx {key} lines {text}"), flush=True)
            if launcher is not None:
                launchers.setdefault(str(sorted(compiled.src.signature.items())), launcher[0])
    print(f"cuda_utils gcc (once per cache, every cold process): {utils_seconds():.2f} s; distinct launcher "
          f"signatures over these cases: {len(launchers) or 'none built (generic launcher)'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
