"""The placement of the logits' gradient after ``portable_softmax.cross_entropy`` of DTensor logits
sharded on the classes, on each rank, beside torch's ``loss_parallel``: through ``loss.sum()``
and ``loss.backward()``, per reduction (issue 33: torch 2.11 on CUDA gave Replicate() where
torch 2.13 on CPU gives Shard(1)).

    torchrun --nproc-per-node 2 benchmarks/probes/dtensor_grad_placement.py [--device cuda]
"""
from __future__ import annotations

import argparse
import contextlib
import os


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args()

    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, distribute_tensor, Shard
    from torch.distributed.tensor.parallel import loss_parallel

    import portable_softmax as ps

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if args.device == "cuda":
        torch.cuda.set_device(rank)
    mesh = init_device_mesh(args.device, (world,))
    torch.manual_seed(5)
    x = (torch.randn(6, 23, dtype=torch.float64) * 3).to(args.device)
    target = torch.randint(0, 23, (6,)).to(args.device)
    for reduction in ("mean", "sum", "none"):
        for how in ("sum", "backward"):
            for name, source in (("ours", "distributed"), ("torch", "distributed"), ("ours", "from_local")):
                if source == "distributed":
                    leaf = distribute_tensor(x, mesh, [Shard(1)]).requires_grad_()
                else:
                    # A contiguous local slice, as a tensor-parallel matmul gives it.
                    local = x.tensor_split(world, 1)[rank].contiguous()
                    leaf = DTensor.from_local(local, mesh, [Shard(1)], shape=x.shape, stride=x.stride()).detach()
                    leaf.requires_grad_()
                seen = []
                leaf.register_hook(lambda g: seen.append((tuple(g.placements), tuple(g.to_local().stride()))))
                if name == "ours":
                    loss = ps.cross_entropy(leaf, target, reduction=reduction)
                else:
                    with loss_parallel():
                        loss = F.cross_entropy(leaf, target, reduction=reduction)
                with loss_parallel() if name == "torch" else contextlib.nullcontext():
                    if how == "sum" or reduction == "none":
                        loss.sum().backward()
                    else:
                        loss.backward()
                grad = leaf.grad
                print(f"rank {rank} torch {torch.__version__} {reduction:4s} via {how:8s} {name:5s} {source:11s}: "
                      f"input local stride {tuple(leaf.to_local().stride())}; grad before accumulation {seen}; "
                      f"grad {tuple(grad.placements)} local {tuple(grad.to_local().shape)}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
