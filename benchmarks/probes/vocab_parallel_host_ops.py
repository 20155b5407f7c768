"""What a repeated ``portable_softmax.distributed.cross_entropy`` call (a vocabulary sharded across
ranks) costs the host: the aten ops it dispatches (a ``TorchDispatchMode``: every op below
autograd, views and the autograd engine's own included; the collectives counted apart), the
collectives and the kernel launches, and its host time per call (the median of many calls);
forward alone (no grad) and forward + ``backward()`` (issue 33: on 2 H200s an 8192x128256 bf16
step took 2.81 ms where its GPU work takes about 1.2: each torch op or launch ~7.5 us of host).

On CPU (the default; gloo) the launches are stubbed (a launch returns its plan at once) and so
is the CPU-only target check (``distributed_loss._check``: it reads C on the host, which an
accelerator's call never does), so that counts and times are an accelerator call's Python path;
the shape is tiny (4 rows, 2 x 150 classes, float32). The host time is given twice: with the
gloo all-reduces (the ranks in step), and with them stubbed out too (``host alone``: the
Python path of one rank). With ``--device cuda`` (NCCL, a GPU a rank) nothing is stubbed, the
shape is 8192 x 2 x 64128 bf16 and calls are timed one by one, a synchronize every 10 calls
outside the timing.

    torchrun --nproc-per-node 2 benchmarks/probes/vocab_parallel_host_ops.py [--device cuda] [--calls N]
"""
from __future__ import annotations

import argparse
import collections
import contextlib
import os
import sys
from collections.abc import Iterator

import torch
import torch.distributed as dist

from portable_softmax import distributed, distributed_loss
from portable_softmax.host_time import median_call_us

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "tests"))
from dispatch_counts import DispatchedOps, counted_launches  # noqa: E402  (the tests' counters, shared)


@contextlib.contextmanager
def _no_collectives() -> Iterator[None]:
    """The all-reduces stubbed out: the host path of one rank, not waiting on the other."""
    real = dist.all_reduce
    dist.all_reduce = lambda tensor, *args, **kwargs: None
    try:
        yield
    finally:
        dist.all_reduce = real


def _case(name: str, kwargs: dict, launches: collections.Counter, args: argparse.Namespace) -> None:
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)  # the same targets and weights on every rank
    rows, classes = args.rows, args.classes
    positions = (rows, *args.extra)
    local_shape = (rows, classes // world + (rank < classes % world), *args.extra)
    x = torch.randn(local_shape, device=args.device).to(getattr(torch, args.dtype)).requires_grad_()
    target = torch.randint(0, classes, positions, device=args.device)
    if kwargs.pop("ignored", False):
        target[::3] = -100
    if kwargs.pop("weight", False):
        kwargs["weight"] = torch.rand(classes, device=args.device) + 0.5

    def forward() -> None:
        with torch.no_grad():
            distributed.cross_entropy(x, target, **kwargs)

    def train() -> None:
        x.grad = None
        loss = distributed.cross_entropy(x, target, **kwargs)
        (loss.sum() if loss.dim() else loss).backward()

    cuda = args.device != "cpu"
    synchronize = torch.cuda.synchronize if cuda else (lambda: None)
    for path, step in (("fwd", forward), ("fwd+bwd", train)):
        step()  # the first call plans and builds its records
        launches.clear()
        with DispatchedOps() as counter:
            step()
        launched = sum(launches.values())
        ops = sum(counter.counts.values())
        with_collectives = median_call_us(step, args.calls, synchronize)
        if cuda:
            alone = float("nan")
        else:
            with _no_collectives():
                alone = median_call_us(step, args.calls, synchronize)
        if rank == 0:
            detail = " ".join(f"{op}:{n}" for op, n in sorted(counter.counts.items()))
            print(f"{name:22} {path:8} ops {ops:3d}  collectives {counter.collectives}  launches {launched}  "
                  f"host {with_collectives:6.1f} us (alone {alone:6.1f})  [{detail}]", flush=True)


CASES = (("mean", {}), ("mean ignored", {"ignored": True}), ("sum", {"reduction": "sum"}),
         ("none", {"reduction": "none"}), ("weight", {"weight": True}), ("smoothing", {"label_smoothing": 0.1}),
         ("weight+smoothing", {"weight": True, "label_smoothing": 0.1}),
         ("z_loss+softcap", {"z_loss": 1e-4, "softcap": 30.0}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--calls", type=int, default=1000)
    parser.add_argument("--rows", type=int, default=None, help="4 on CPU, 8192 elsewhere")
    parser.add_argument("--classes", type=int, default=None, help="all ranks' together: 300 on CPU, 128256 elsewhere")
    parser.add_argument("--extra", default="", help="further position dims, e.g. 3 or 3x2 (default: none)")
    parser.add_argument("--dtype", default=None, help="float32 on CPU, bfloat16 elsewhere")
    parser.add_argument("--cases", default=None, help="comma-separated case names (default: all)")
    args = parser.parse_args()
    cpu = args.device == "cpu"
    args.rows = args.rows or (4 if cpu else 8192)
    args.classes = args.classes or (300 if cpu else 128256)
    args.extra = tuple(int(n) for n in args.extra.split("x")) if args.extra else ()
    args.dtype = args.dtype or ("float32" if cpu else "bfloat16")
    rank = int(os.environ["RANK"])
    if cpu:
        dist.init_process_group("gloo")
        torch.set_num_threads(1)  # torch's intra-op threads wait on each other on a loaded machine
        distributed_loss._check = lambda *args: None
    else:
        os.environ.update(NCCL_NVLS_ENABLE="0", TORCH_SYMM_MEM_DISABLE_MULTICAST="1", NVSHMEM_DISABLE_NVLS="1")
        torch.cuda.set_device(rank)
        dist.init_process_group("nccl", device_id=torch.device("cuda", rank))
    launches = counted_launches(stub=cpu)
    wanted = args.cases.split(",") if args.cases else None
    try:
        for name, kwargs in CASES:
            if wanted is None or name in wanted:
                _case(name, dict(kwargs), launches, args)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
