"""What the host's pieces of a loss call cost on this machine (NOTES v51): microseconds a call of
the operations a repeated ``cross_entropy`` forward + backward makes, each timed alone, with the
GPU idle (a synchronize before each call, outside its timing) and busy (a long sleep kernel queued
before the loop, so that each launch lands behind work).

The launches are the backward's rescale (``cross_entropy_grad_scale``, two pointers) and the split
forward's record (nine pointers, cooperative), each (a) through the library's record, (b) through
Triton's launcher object (``CompiledKernel.run``), (c) through its C ``launch`` with the tensors and
(d) with their addresses as ints (no ``data_ptr`` call and no ``cuPointerGetAttribute`` check a
pointer); beside a torch launch of the same kind.

    PYTHONPATH=. python3 benchmarks/probes/host_costs.py
"""
from __future__ import annotations

import statistics
import time


def main() -> None:
    import torch

    import portable_softmax as ps
    from portable_softmax import loss_launch

    device = torch.device("cuda")
    rows, cols = 4096, 50257
    x = (torch.randn(rows, cols, device=device) * 2).to(torch.bfloat16).requires_grad_()
    target = torch.randint(0, cols, (rows,), device=device)
    small = torch.zeros(8, device=device)

    def idle(fn, n=200):
        found = []
        for _ in range(n):
            torch.cuda.synchronize()
            start = time.perf_counter()
            fn()
            found.append(time.perf_counter() - start)
        return statistics.median(found) * 1e6

    def busy(fn, n=300):
        torch.cuda.synchronize()
        torch.cuda._sleep(2_000_000_000 // 1000 * 50)  # ~50 ms at ~2 GHz: longer than the loop
        start = time.perf_counter()
        for _ in range(n):
            fn()
        spent = (time.perf_counter() - start) / n * 1e6
        torch.cuda.synchronize()
        return spent

    def row(name, fn, launches=True):
        for _ in range(20):
            fn()
        torch.cuda.synchronize()
        b = busy(fn) if launches else float("nan")
        i = idle(fn)
        print(f"{name:58s} idle {i:7.1f}  busy {b:7.1f}", flush=True)

    print(f"{torch.cuda.get_device_name(device)}, torch {torch.__version__}; host us a call (medians idle)")
    noop = lambda: None  # noqa: E731
    row("python: a no-op call", noop, False)
    row("tensor: x.data_ptr()", x.data_ptr, False)
    row("tensor: x.stride()", x.stride, False)
    row("tensor: x.shape, x.dtype, x.device", lambda: (x.shape, x.dtype, x.device), False)
    row("alloc: torch.empty_like(x) (411 MB, cached)", lambda: torch.empty_like(x), False)
    row("alloc: x.new_empty(())", lambda: x.new_empty(()), False)
    row("alloc: new_empty((4096,), float32)", lambda: x.new_empty((4096,), dtype=torch.float32), False)
    row("alloc: torch.ones_like(scalar) (a fill launch)", lambda: torch.ones_like(small[0]))
    row("torch launch: small.add_(1)", lambda: small.add_(1))
    row("torch launch: small.mul_(small)", lambda: small.mul_(small))
    import triton
    stream = triton.runtime.driver.active.get_current_stream
    row("stream: triton get_current_stream(0)", lambda: stream(0), False)
    row("stream: torch.cuda.current_stream().cuda_stream",
        lambda: torch.cuda.current_stream().cuda_stream, False)

    class Trivial(torch.autograd.Function):
        @staticmethod
        def forward(ctx, a, b):
            ctx.held = held
            return a.new_empty(())

        @staticmethod
        def backward(ctx, g):
            return ctx.held, None

    held = torch.empty_like(x)
    row("autograd: Trivial.apply(x, target) (one output)", lambda: Trivial.apply(x, target), False)

    def engine():
        x.grad = None
        Trivial.apply(x, target).backward()

    row("autograd: Trivial.apply + backward() (engine, ones_like)", engine)

    # The rescale's record, as a held gradient's backward makes it.
    grad = torch.empty_like(x)
    dloss = torch.ones((), device=device, dtype=torch.bfloat16)
    record = loss_launch._grad_scale(grad, dloss)
    record((grad, dloss))
    row("rescale (a) our record", lambda: record((grad, dloss)))
    kernel, plan = record.kernel, record.plan
    args = (grad, dloss, *record.scalars)
    compiled = kernel.warmup(*args, grid=(plan.programs,), **record.launches[0], **record.options)
    compiled._init_handles()
    values = iter(args[2:])
    tail = tuple(record.launches[0][p.name] if p.is_constexpr else next(values) for p in kernel.params[2:])
    run, function, metadata = compiled.run, compiled.function, compiled.packed_metadata
    s = stream(0)
    row("rescale (b) CompiledKernel.run",
        lambda: run(plan.programs, 1, 1, s, function, metadata, None, None, None, grad, dloss, *tail))
    c_launch = run.launch
    coop, pdl = run.launch_cooperative_grid, run.launch_pdl
    row("rescale (c) C launch, tensors",
        lambda: c_launch(plan.programs, 1, 1, s, function, coop, pdl, None, None, metadata, None, None, None,
                         grad, dloss, *tail))
    g_ptr, d_ptr = grad.data_ptr(), dloss.data_ptr()
    row("rescale (d) C launch, ints",
        lambda: c_launch(plan.programs, 1, 1, s, function, coop, pdl, None, None, metadata, None, None, None,
                         g_ptr, d_ptr, *tail))
    row("rescale (e) C launch, ints from data_ptr()",
        lambda: c_launch(plan.programs, 1, 1, s, function, coop, pdl, None, None, metadata, None, None, None,
                         grad.data_ptr(), dloss.data_ptr(), *tail))
    row("rescale (f) C launch, ints, no PDL",
        lambda: c_launch(plan.programs, 1, 1, s, function, coop, 0, None, None, metadata, None, None, None,
                         g_ptr, d_ptr, *tail))

    # The split forward's record: a forward with grad once, then its record replayed.
    from portable_softmax import launch as launch_module
    original = launch_module.LaunchRecord.__call__
    kept = []

    def keep(self, tensors):
        kept.append((self, tensors))
        return original(self, tensors)

    launch_module.LaunchRecord.__call__ = keep
    ps.cross_entropy(x, target).backward()
    launch_module.LaunchRecord.__call__ = original
    split, split_tensors = next((r, t) for r, t in kept if r.plan.regime == "split")
    print(f"split record: {split.kernel.fn.__name__}, {split.plan.programs} programs, "
          f"{len(split_tensors)} tensors", flush=True)
    row("split (a) our record", lambda: split(split_tensors))
    direct = split._direct[0]
    # The record's own pool (a ticketed or phased plan keeps another than the persistent one).
    scratch = split._pool.get(split.device, s, split._slots, split._counters)
    full = (*split_tensors, *scratch)
    row("split (a') our direct closure", lambda: direct(s, full))
    args = (*full, *split.scalars)
    n = len(full)
    compiled = split.kernel.warmup(*args, grid=(split.plan.programs,), **split.launches[0], **split.options)
    compiled._init_handles()
    values = iter(args[n:])
    tail = tuple(split.launches[0][p.name] if p.is_constexpr else next(values) for p in split.kernel.params[n:])
    run, function, metadata = compiled.run, compiled.function, compiled.packed_metadata
    c_launch, coop, pdl = run.launch, run.launch_cooperative_grid, run.launch_pdl
    ptrs = tuple(t.data_ptr() for t in full)
    programs = split.plan.programs
    row("split (b) CompiledKernel.run",
        lambda: run(programs, 1, 1, s, function, metadata, None, None, None, *full, *tail))
    row("split (c) C launch, tensors",
        lambda: c_launch(programs, 1, 1, s, function, coop, pdl, None, None, metadata, None, None, None,
                         *full, *tail))
    row("split (d) C launch, ints",
        lambda: c_launch(programs, 1, 1, s, function, coop, pdl, None, None, metadata, None, None, None,
                         *ptrs, *tail))
    row("split (g) C launch, ints, not cooperative",
        lambda: c_launch(programs, 1, 1, s, function, 0, pdl, None, None, metadata, None, None, None,
                         *ptrs, *tail))

    def ours_forward():
        return ps.cross_entropy(x, target)

    def ours_call():
        x.grad = None
        ps.cross_entropy(x, target).backward()

    import torch.nn.functional as F

    def torch_call():
        x.grad = None
        F.cross_entropy(x, target).backward()

    row("ours: forward with grad", ours_forward)
    row("ours: forward + backward()", ours_call)
    with torch.no_grad():
        row("ours: forward alone (no_grad)", ours_forward)
    row("torch: forward with grad", lambda: F.cross_entropy(x, target))
    row("torch: forward + backward()", torch_call)


if __name__ == "__main__":
    main()
