"""Probe: a row held across a cluster of thread blocks, from the library's own tile kernels.

QuACK keeps a long row on chip by spreading it over a cluster of CTAs whose shared memories can
read each other (distributed shared memory), so a row of up to 16 x a CTA's registers needs one
read and one write and no exchange through global memory. Triton 3.9 compiles that from plain
Triton: a kernel launched with ``num_ctas=C`` on sm_90 lays a [1, BLOCK_N] block over the C CTAs of
a cluster and reduces it through distributed shared memory (``mapa``, ``barrier.cluster``). The
tile kernels of ``kernels/rows.py`` then hold a row of BLOCK_N elements in C CTAs' registers, unchanged.
Triton 3.6-3.8 reject the layout (TritonGPUPlanCTAPass).

For each shape, dtype and direction this times the library's planned launch (``ours``) and the
one-row tile kernel on clusters of C CTAs of W warps each (grid: a program per row), checks each
against float64 torch, and prints fractions of ``x.clone()`` bandwidth from the same run.
Needs Triton 3.9 or newer on the GPU machine. Run 1 (NOTES v13) carried a stripped 3.9.0 there:
libtriton.so without symbols, in `.t39/` (ignored), unpacked to /tmp/t39, with
`TRITON_BACKENDS_IN_TREE=1` (the AMD backend left out) and `ptxas-blackwell` linked to `ptxas`.
Usage: python3 benchmarks/probes/cluster_rows.py [bfloat16,float32] [MxN,...]
"""
import sys
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context

import torch
import triton
from triton.testing import do_bench

from portable_softmax import kernels, op_calls, ops
from portable_softmax.selfcheck import relative_error

SHAPES = [(16384, 16384), (16384, 32768), (16384, 65536), (8192, 131072), (4096, 262144), (4096, 50257),
          (4096, 151936), (32, 128256), (1, 128256)]
# Elements each thread holds per tensor; warps per CTA. The cluster size follows from the row.
HOLDS = (16, 32, 64)
WARPS = (4, 8, 16)
MAX_CTAS = 16


def configs(n_cols: int) -> list[tuple[int, int]]:
    """(ctas, warps) pairs whose threads hold HOLDS elements of a row each."""
    block = triton.next_power_of_2(n_cols)
    found = []
    for hold in HOLDS:
        for warps in WARPS:
            ctas = block // (hold * 32 * warps)
            if 2 <= ctas <= MAX_CTAS and ctas * hold * 32 * warps == block:
                found.append((ctas, warps))
    return sorted(set(found))


def cluster_forward(x: torch.Tensor, y: torch.Tensor, ctas: int, warps: int) -> None:
    m, n = x.shape
    kernels.softmax_forward_tile[(m,)](
        x, y, m, m, m, n, 0, x.stride(0), x.stride(1), 0, y.stride(0), y.stride(1),
        BLOCK_M=1, BLOCK_N=triton.next_power_of_2(n), LOG=False, ACC_FP64=False, REREAD=False, PER_TILE=True,
        num_warps=warps, num_ctas=ctas)


def cluster_backward(y: torch.Tensor, dy: torch.Tensor, dx: torch.Tensor, ctas: int, warps: int) -> None:
    m, n = y.shape
    kernels.softmax_backward_tile[(m,)](
        y, dy, dx, m, m, m, n, 0, y.stride(0), y.stride(1), 0, dy.stride(0), dy.stride(1), 0, dx.stride(0),
        dx.stride(1), BLOCK_M=1, BLOCK_N=triton.next_power_of_2(n), LOG=False, ACC_FP64=False, REREAD=False,
        PER_TILE=True, num_warps=warps, num_ctas=ctas)


def _compile(case: tuple) -> str:
    """Compile one cluster kernel into Triton's cache (a worker process: compiles run in parallel)."""
    dtype, m, n, backward, ctas, warps = case
    dtype = getattr(torch, dtype)
    block = triton.next_power_of_2(n)
    common = dict(BLOCK_M=1, BLOCK_N=block, LOG=False, ACC_FP64=False, REREAD=False, PER_TILE=True,
                  num_warps=warps, num_ctas=ctas, grid=(m,))
    try:
        if backward:
            kernels.softmax_backward_tile.warmup(dtype, dtype, dtype, m, m, m, n, 0, n, 1, 0, n, 1, 0, n, 1, **common)
        else:
            kernels.softmax_forward_tile.warmup(dtype, dtype, m, m, m, n, 0, n, 1, 0, n, 1, **common)
    except Exception as error:
        return f"{case}: {type(error).__name__}"
    return ""


def precompile(dtypes: list, shapes: list) -> None:
    cases = [(str(d)[6:], m, n, backward, c, w) for d in dtypes for m, n in shapes for backward in (False, True)
             for c, w in configs(n)]
    with ProcessPoolExecutor(12, mp_context=get_context("spawn")) as pool:
        failed = [f for f in pool.map(_compile, cases) if f]
    print(f"precompiled {len(cases) - len(failed)} of {len(cases)}", *failed, sep="\n  ")


def main() -> None:
    dtypes = [getattr(torch, d) for d in (sys.argv[1] if len(sys.argv) > 1 else "bfloat16,float32").split(",")]
    shapes = SHAPES
    if len(sys.argv) > 2:
        shapes = [tuple(map(int, s.split("x"))) for s in sys.argv[2].split(",")]
    precompile(dtypes, shapes)
    print(f"{torch.cuda.get_device_name()} | torch {torch.__version__} | triton {triton.__version__}")
    print(f"{'dtype':>8} {'shape':>13} {'variant':>10} {'fwd':>5} {'bwd':>5}  errors (fwd/bwd)")
    for dtype in dtypes:
        for m, n in shapes:
            x = torch.randn(m, n, device="cuda", dtype=dtype) * 3
            dy = torch.randn_like(x)
            size = x.element_size()
            copies = [do_bench(lambda: x.clone(), warmup=10, rep=50)]
            reference = torch.softmax(x.double(), -1)
            y_ref = torch.softmax(x, -1)
            dx_ref = torch._softmax_backward_data(dy.double(), y_ref.double(), -1, torch.float64)
            timed = []
            variants = [("ours", None)] + [(f"c{c}w{w}", (c, w)) for c, w in configs(n)]
            for name, cfg in variants:
                y = torch.full_like(x, float("nan"))
                dx = torch.full_like(x, float("nan"))
                try:
                    if cfg is None:
                        fwd = lambda: y.copy_(ops.softmax(x, -1))
                        bwd = lambda: dx.copy_(op_calls._backward(y_ref, dy, 1, dtype, False))
                        run_f = lambda: ops.softmax(x, -1)
                        run_b = lambda: op_calls._backward(y_ref, dy, 1, dtype, False)
                    else:
                        run_f = fwd = lambda: cluster_forward(x, y, *cfg)
                        run_b = bwd = lambda: cluster_backward(y_ref, dy, dx, *cfg)
                    fwd()
                    bwd()
                    errors = (relative_error(y, reference), relative_error(dx, dx_ref))
                    f_ms = do_bench(run_f, warmup=10, rep=50)
                    b_ms = do_bench(run_b, warmup=10, rep=50)
                    timed.append((name, f_ms, b_ms, errors))
                except Exception as error:  # a config that does not compile or launch is a result
                    timed.append((name, None, None, f"{type(error).__name__}: {str(error)[:160]}"))
            copies.append(do_bench(lambda: x.clone(), warmup=10, rep=50))
            copy_ms = min(copies)
            for name, f_ms, b_ms, errors in timed:
                if f_ms is None:
                    print(f"{str(dtype)[6:]:>8} {f'{m}x{n}':>13} {name:>10}  fail  {errors}")
                    continue
                print(f"{str(dtype)[6:]:>8} {f'{m}x{n}':>13} {name:>10} {copy_ms / f_ms:5.2f} "
                      f"{1.5 * copy_ms / b_ms:5.2f}  {errors[0]:.1e}/{errors[1]:.1e}")
            del x, dy, reference, y_ref, dx_ref
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
