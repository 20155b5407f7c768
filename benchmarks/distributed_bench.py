"""Softmax over a dimension sharded across GPUs (issue 21): ours against torch's DTensor path, the
same algorithm in torch operations, and the floor (three passes over the local slice at copy
speed plus the collective), on every GPU of one host through NCCL. Timed as
``../shared/probes/dt_baseline.py`` times: wall clock over 20 calls after 3, synchronised and
behind a barrier. Checks every rank's slice against torch first.

    python benchmarks/distributed_bench.py [--rows 8192 --cols 151936] [--out results.json]
    python benchmarks/distributed_bench.py --device cpu --rows 64 --cols 1000   # gloo, a smoke test
"""
from __future__ import annotations

import argparse
import json
import os
import time

# NVLink multicast stays off (the device notes: it can take the host's GPUs out of service).
for _name, _value in (("NCCL_NVLS_ENABLE", "0"), ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"),
                      ("NVSHMEM_DISABLE_NVLS", "1")):
    os.environ[_name] = _value

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402


def _timed(fn, device: str, n: int = 20) -> float:
    """Milliseconds per call."""
    for _ in range(3):
        fn()
    if device == "cuda":
        torch.cuda.synchronize()
    dist.barrier()
    start = time.perf_counter()
    for _ in range(n):
        fn()
    if device == "cuda":
        torch.cuda.synchronize()
    dist.barrier()
    return (time.perf_counter() - start) / n * 1e3


def _rank_main(rank: int, world: int, args: argparse.Namespace) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(args.port))
    if args.device == "cuda":
        torch.cuda.set_device(rank)
        dist.init_process_group("nccl", rank=rank, world_size=world, device_id=torch.device("cuda", rank))
    else:
        dist.init_process_group("gloo", rank=rank, world_size=world)
    import portable_softmax as ps
    from portable_softmax import distributed
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    device = args.device
    mesh = init_device_mesh(device, (world,))
    rows, cols = args.rows, args.cols
    x = torch.randn(rows, cols, device=device, dtype=torch.bfloat16) * 3
    dist.broadcast(x, 0)
    dt = distribute_tensor(x, mesh, [Shard(1)])
    local = dt.to_local()
    dy = torch.randn_like(local)

    # Correctness first: this rank's slice against torch on the whole tensor, forward and backward.
    leaf = local.clone().requires_grad_()
    y = distributed.softmax(leaf, -1)
    (dx,) = torch.autograd.grad(y, leaf, dy)
    full = x.float().requires_grad_()
    reference = torch.softmax(full, -1)
    gathered = [torch.empty_like(dy) for _ in range(world)]
    dist.all_gather(gathered, dy)
    (reference_dx,) = torch.autograd.grad(reference, full, torch.cat(gathered, -1).float())
    start = sum(g.shape[1] for g in gathered[:rank])
    expected, expected_dx = reference[:, start:start + local.shape[1]], reference_dx[:, start:start + local.shape[1]]
    error = ((y.float() - expected).norm() / expected.norm()).item()
    error_dx = ((dx.float() - expected_dx).norm() / expected_dx.norm()).item()
    dt_y = ps.softmax(dt, -1)
    placements_kept = tuple(dt_y.placements) == (Shard(1),)
    del full, reference, reference_dx, gathered, expected, expected_dx

    def manual():
        m = local.amax(-1, keepdim=True).float()
        dist.all_reduce(m, op=dist.ReduceOp.MAX)
        e = torch.exp(local.float() - m)
        s = e.sum(-1, keepdim=True)
        dist.all_reduce(s)
        return (e / s).to(local.dtype)

    partials = torch.empty(rows, 2, device=device)
    gathered_partials = torch.empty(world * rows, 2, device=device)
    trainable = local.clone().requires_grad_()

    def forward_backward():
        out = distributed.softmax(trainable, -1)
        torch.autograd.grad(out, trainable, dy)

    times = {
        "ours: distributed.softmax (result sharded)": _timed(lambda: distributed.softmax(local, -1), device),
        "ours: forward + backward through autograd": _timed(forward_backward, device),
        "ours: softmax of the DTensor (placements kept)": _timed(lambda: ps.softmax(dt, -1), device),
        "torch.softmax of the DTensor (all-gather, replicated result)": _timed(lambda: torch.softmax(dt, -1), device),
        "torch ops: max, all_reduce, exp-sum, all_reduce, normalize": _timed(manual, device),
        "ours: softmax of the local slice alone": _timed(lambda: ps.softmax(local, -1), device),
        "torch: softmax of the local slice alone": _timed(lambda: torch.softmax(local, -1), device),
        "clone of the local slice": _timed(lambda: local.clone(), device),
        "all_gather of the partials alone": _timed(lambda: dist.all_gather_into_tensor(gathered_partials, partials),
                                                   device),
    }
    floor = 1.5 * times["clone of the local slice"] + times["all_gather of the partials alone"]
    if rank == 0:
        name = torch.cuda.get_device_name() if device == "cuda" else "cpu"
        print(f"{rows}x{cols} bf16 sharded on dim 1 over {world} ranks ({name}, {device}); torch {torch.__version__}")
        print(f"rank 0 slice: forward error {error:.2e}, backward error {error_dx:.2e}; DTensor placements kept: "
              f"{placements_kept}")
        print("| ms per call | |\n|---|---|")
        for label, ms in times.items():
            print(f"| {label} | {ms:.3f} |")
        print(f"| floor: 1.5 x clone + all_gather of the partials | {floor:.3f} |")
        ours = times["ours: distributed.softmax (result sharded)"]
        print(f"ours / floor = {ours / floor:.2f}; torch DTensor / ours = "
              f"{times['torch.softmax of the DTensor (all-gather, replicated result)'] / ours:.1f}x")
        if args.out:
            with open(args.out, "w") as handle:
                json.dump({"rows": rows, "cols": cols, "world": world, "device": name, "times_ms": times,
                           "floor_ms": floor, "forward_error": error, "backward_error": error_dx,
                           "placements_kept": placements_kept}, handle, indent=1)
    ok = error < 2e-2 and error_dx < 2e-2 and placements_kept
    dist.destroy_process_group()
    if not ok:
        raise SystemExit(f"rank {rank}: forward error {error:.2e}, backward error {error_dx:.2e}, "
                         f"placements kept {placements_kept}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=8192)
    parser.add_argument("--cols", type=int, default=151936)
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--ranks", type=int, default=0, help="default: every GPU (cuda), 2 (cpu)")
    parser.add_argument("--port", type=int, default=29641)
    parser.add_argument("--out", default="")
    args = parser.parse_args()
    world = args.ranks or (torch.cuda.device_count() if args.device == "cuda" else 2)
    mp.spawn(_rank_main, args=(world, args), nprocs=world)


if __name__ == "__main__":
    main()
