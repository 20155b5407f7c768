"""Softmax over a dimension sharded across ranks (``portable_softmax.distributed``) and DTensor
inputs, on CPU processes talking gloo over loopback: 2 and 3 ranks, uneven slices, both
functions, forward and backward, float32 and bfloat16. Each rank checks its slice against
torch's result for the whole tensor in float64; an error on any rank fails the test."""
from __future__ import annotations

import os
import socket
import sys

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from portable_softmax.selfcheck import relative_error, tolerance

pytestmark = pytest.mark.skipif(not (dist.is_available() and dist.is_gloo_available()), reason="no gloo here")

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(world: int, check, *args, device: str = "cpu") -> None:
    """``check(rank, world, *args)`` on ``world`` new processes joined in a gloo group (``device``
    'cuda': an NCCL group, a GPU per rank); a failure on any rank is raised here. Spawned, not
    forked: a fork of a process whose OpenMP threads have run (the rest of the suite) can hang in
    the child."""
    port = _free_port()
    mp.start_processes(_rank_main, args=(world, port, check, args, device), nprocs=world, start_method="spawn")


def _rank_main(rank: int, world: int, port: int, check, args, device: str = "cpu") -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    if device == "cuda":
        # NVLink multicast stays off (the device notes: it can take the host's GPUs out of service).
        os.environ.update(NCCL_NVLS_ENABLE="0", TORCH_SYMM_MEM_DISABLE_MULTICAST="1", NVSHMEM_DISABLE_NVLS="1")
        torch.cuda.set_device(rank)
        dist.init_process_group("nccl", rank=rank, world_size=world, device_id=torch.device("cuda", rank))
    else:
        dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        check(rank, world, *args)
    finally:
        dist.destroy_process_group()
    # A rank whose checks passed leaves without C++'s exit-time destructors: in whole-suite runs
    # with Triton 3.2 a DTensor rank at times aborted with "terminate called without an active
    # exception" (SIGABRT; 2 of 3 runs here, none of 12 runs of those tests alone), the message of
    # a thread destroyed while joinable. A failed check raises above, and the spawn reports it;
    # an abort during the checks still fails the test.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _slices(length: int, world: int) -> list[int]:
    """Uneven slices: 5, 7, ... and the rest on the last rank (1 of 13 for 3 ranks)."""
    sizes = [5 + 2 * i for i in range(world - 1)]
    return sizes + [length - sum(sizes)]


def _check_sharded(rank: int, world: int, shape: tuple[int, ...], dim: int, dtype: torch.dtype, log: bool) -> None:
    from portable_softmax import distributed

    torch.manual_seed(1234)  # the same full tensor on every rank
    x = (torch.randn(shape) * 3).to(dtype)
    dy = torch.randn(shape).to(dtype)
    sizes = _slices(shape[dim], world)
    local = x.split(sizes, dim)[rank].clone().requires_grad_()
    y = (distributed.log_softmax if log else distributed.softmax)(local, dim)
    full = x.double().requires_grad_()
    reference = (torch.log_softmax if log else torch.softmax)(full, dim)
    (reference_dx,) = torch.autograd.grad(reference, full, dy.double())
    # torch's own error in this dtype, on the whole tensor, sets the bound (selfcheck.tolerance).
    own = x.clone().requires_grad_()
    theirs = (torch.log_softmax if log else torch.softmax)(own, dim)
    (their_dx,) = torch.autograd.grad(theirs, own, dy)
    expected = reference.split(sizes, dim)[rank]
    assert y.dtype == dtype and y.shape == local.shape
    bound = tolerance(dtype, relative_error(theirs.split(sizes, dim)[rank], expected))
    assert relative_error(y, expected) <= bound, f"rank {rank}: forward"
    # The slice alone would give another result: the ranks' partials were combined.
    alone = (torch.log_softmax if log else torch.softmax)(local.detach().double(), dim)
    assert relative_error(alone, expected) > 2 * bound
    (dx,) = torch.autograd.grad(y, local, dy.split(sizes, dim)[rank])
    expected_dx = reference_dx.split(sizes, dim)[rank]
    bound = tolerance(dtype, relative_error(their_dx.split(sizes, dim)[rank], expected_dx))
    assert relative_error(dx, expected_dx) <= bound, f"rank {rank}: backward"


def _check_each(rank: int, world: int, check, cases: list[tuple]) -> None:
    """``check(rank, world, *case)`` for each case in one process group: its processes take
    seconds to start (torch's import, gloo), a case's checks a fraction of one."""
    for case in cases:
        try:
            check(rank, world, *case)
        except AssertionError as error:
            raise AssertionError(f"{check.__name__}{case}: {error}") from error


@pytest.mark.parametrize("world", [2, 3])
def test_sharded_rows_match_torch(world):
    """Both functions, float32 and bfloat16, on 2 ranks and on 3 (a middle rank)."""
    cases = [((6, 13), -1, dtype, log) for dtype in (torch.float32, torch.bfloat16) for log in (False, True)]
    _run(world, _check_each, _check_sharded, cases)


def test_a_sharded_middle_dimension():
    _run(2, _check_sharded, (3, 17, 4), 1, torch.float32, False)


def _check_empty_slice(rank: int, world: int) -> None:
    """A rank whose slice is empty still takes part; the others' results are the whole softmax."""
    from portable_softmax import distributed

    torch.manual_seed(7)
    x = torch.randn(4, 9)
    sizes = [9, 0]
    local = x.split(sizes, -1)[rank]
    y = distributed.softmax(local, -1)
    assert relative_error(y, torch.softmax(x.double(), -1).split(sizes, -1)[rank]) < 1e-5 if local.numel() else \
        y.shape == (4, 0)


def test_an_empty_slice():
    _run(2, _check_empty_slice)


def _check_dtensor(rank: int, world: int, placement: str) -> None:
    import portable_softmax as ps
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor

    mesh = init_device_mesh("cpu", (world,))
    torch.manual_seed(99)
    x = torch.randn(8, 12) * 3
    placements = {"softmax_dim": [Shard(1)], "other_dim": [Shard(0)], "replicated": [Replicate()]}[placement]
    weights = torch.randn(8, 12)
    dt = distribute_tensor(x, mesh, placements).requires_grad_()
    local_weights = distribute_tensor(weights, mesh, placements).to_local()
    for log in (False, True):
        y = (ps.log_softmax if log else ps.softmax)(dt, -1)
        assert isinstance(y, DTensor) and tuple(y.placements) == tuple(placements) and y.shape == x.shape
        full = x.double().requires_grad_()
        reference = (torch.log_softmax if log else torch.softmax)(full, -1)
        assert relative_error(y.full_tensor(), reference) < 1e-5, f"rank {rank}: {placement}"
        # Each rank's loss weighs its shard: together (or, replicated, each) they weigh the whole.
        (dx,) = torch.autograd.grad((y.to_local() * local_weights).sum(), dt)
        (expected,) = torch.autograd.grad(reference, full, weights.double())
        assert relative_error(dx.full_tensor(), expected) < 1e-5, f"rank {rank}: {placement} backward"


def test_dtensors_keep_their_placements():
    """Sharded on the softmax dimension, on another, and replicated."""
    _run(2, _check_each, _check_dtensor, [("softmax_dim",), ("other_dim",), ("replicated",)])


def _check_without_warnings(rank: int, world: int) -> None:
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a warning from the package's own calls fails the rank
        _check_sharded(rank, world, (3, 20), -1, torch.float32, False)


def test_the_collectives_raise_no_warnings():
    """The all-gather of the partials uses torch's current collective (``all_gather_into_tensor``
    warns FutureWarning on torch 2.13)."""
    _run(2, _check_without_warnings)


def test_importing_the_package_does_not_load_dtensor():
    """DTensors are recognised without importing ``torch.distributed.tensor`` (over a second of a
    bare import): importing the package leaves it unloaded."""
    import subprocess
    from pathlib import Path

    import portable_softmax

    code = "import sys, portable_softmax; print('torch.distributed.tensor' in sys.modules)"
    root = Path(portable_softmax.__file__).resolve().parent.parent
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=root, timeout=300)
    assert result.stdout.strip() == "False", result.stderr
