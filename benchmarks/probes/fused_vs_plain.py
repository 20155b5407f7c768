"""What the fused variants cost over the plain kernels of the same shape (issue 20): each fused
case of ``bench --cases fused`` timed forward and as the backward op, fused and plain, with the
plans they take. Fractions of copy count what each must move (a causal forward: the kept half of
x read; the mask's bytes), as ``bench`` does.

    python benchmarks/probes/fused_vs_plain.py [--only NAME ...] [--tuning '{"elements_per_thread": 32}' ...]

Each ``--tuning`` (the CUDA tuning's fields, as JSON; a list is a set of directions) runs the
cases again under it.
"""
from __future__ import annotations

import argparse
import dataclasses
import json

import torch
from triton.testing import do_bench

import portable_softmax as ps
from portable_softmax import bench_cases, device, fused, launch, tuning


_built: list = []
_build_record = launch.build_record


def _recording_build(*args, **kwargs):
    """``launch.build_record``, noting each plan built (plain and fused calls keep their records
    in their own caches)."""
    record = _build_record(*args, **kwargs)
    _built.append(record.plan)
    return record


launch.build_record = _recording_build


def plans_since(count: int) -> list[str]:
    return [f"{p.regime} {p.block_m}x{p.block_n} c{p.chunks} w{p.num_warps} s{p.num_stages} p{p.programs}"
            f"{' reread' if p.reread else ''}{' T' if p.ticketed else ''}" for p in _built[count:]]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--only", nargs="+", help="the cases whose names contain one of these")
    parser.add_argument("--tuning", action="append", default=[], type=json.loads)
    args = parser.parse_args()
    print(torch.cuda.get_device_name())
    # The device's own row (by name, architecture or default): each --tuning changes it.
    base = tuning.tuning_for(device.device_record("cuda"))
    for changes in [{}] + args.tuning:
        if changes:
            print(f"tuning {changes}")
        # JSON lists name sets of directions (split_tickets, split_pipelined, ...).
        fields = {k: frozenset(v) if isinstance(v, list) else v for k, v in changes.items()}
        tuning.TUNING[("cuda", "*")] = dataclasses.replace(base, **fields)
        run([case for case in bench_cases.cases(fused_only=True)
             if not args.only or any(part in case.name for part in args.only)])


def run(cases: list) -> None:
    for case in cases:
        x = case.make(torch.device("cuda"), False)
        fusion = case.fused_arguments(x)
        dim = case.dim % x.dim()
        moved = x.numel() * x.element_size()
        copy = min(do_bench(lambda: x.clone()) for _ in range(2))
        extra = sum(t.numel() * t.element_size() for t in fusion.values() if isinstance(t, torch.Tensor))
        fused_forward = (1.5 if fusion.get("causal") else 2) * moved + extra
        dy = torch.randn_like(x)
        y = ps.softmax(x, dim, **fusion)
        line = []
        for name, forward, backward, forward_bytes in (
                ("fused", lambda: ps.softmax(x, dim, **fusion),
                 lambda: fused._fused_backward(y, dy, dim, y.dtype, False, fusion.get("scale"), fusion.get("mask"),
                                               fusion.get("causal", False)), fused_forward),
                ("plain", lambda: ps.softmax(x, dim), lambda: ps.op_calls._backward(y, dy, dim, y.dtype, False),
                 2 * moved)):
            before = len(_built)
            forward(), backward()
            f = forward_bytes / do_bench(forward) / (2 * moved / copy)
            b = 3 * moved / do_bench(backward) / (2 * moved / copy)
            line.append(f"{name} {f:.2f} / {b:.2f} [{'; '.join(plans_since(before))}]")
            launch._records.clear()
            ps.op_calls._forward_calls.clear(), ps.op_calls._backward_calls.clear()
            fused._forward_calls.clear(), fused._backward_calls.clear()
        print(f"{case.name} {str(case.dtype)[6:]}: " + " | ".join(line), flush=True)
        del x, dy, y, fusion
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
