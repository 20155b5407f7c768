"""The loss over a vocabulary sharded across ranks (``portable_softmax.distributed.cross_entropy``,
DTensor logits sharded on the class dimension), on CPU processes talking gloo: 2 and 3 ranks,
uneven slices and an empty one. Each rank checks the loss of the whole and its slice of the
gradient against torch's loss of the whole logits in float64 (``test_loss.reference``: z-loss and
softcap as their definitions compose); DTensors against torch's own ``loss_parallel``. One
process group runs many cases (``test_distributed._check_each``): its start takes seconds."""
from __future__ import annotations

import math

import pytest
import torch
import torch.distributed as dist

from portable_softmax.selfcheck import relative_error
from dispatch_counts import DispatchedOps, FloatBuffers
from test_distributed import _check_each, _run
from test_loss import TOLERANCE, reference

pytestmark = pytest.mark.skipif(not (dist.is_available() and dist.is_gloo_available()), reason="no gloo here")

# CPU processes in a gloo group, 2 and 3 ranks; 2 GPUs in an NCCL group where the host has them.
_TWO_GPUS = torch.cuda.is_available() and torch.cuda.device_count() >= 2 and dist.is_nccl_available()
GROUPS = [pytest.param("cpu", 2, id="cpu-2"), pytest.param("cpu", 3, id="cpu-3"),
          pytest.param("cuda", 2, id="cuda-2", marks=pytest.mark.skipif(not _TWO_GPUS, reason="needs 2 GPUs, NCCL"))]

# Slices of the classes per world size: uneven, and for 3 ranks an empty middle one.
SLICES = {2: [9, 14], 3: [5, 0, 18]}

# (shape with C classes on dim 1, dtype, options): paired options, every reduction and dtype, each
# gradient form of distributed_loss._kernel_call (no smoothing; unweighted smoothing; weighted).
CASES = [
    ((6, 23), torch.float32, dict()),
    ((6, 23), torch.bfloat16, dict(reduction="sum", weight=True, label_smoothing=0.1)),
    ((5, 23), torch.float64, dict(reduction="none", weight=True, ignored=0.3)),
    ((5, 23), torch.float16, dict(ignored=0.4, z_loss=1e-3, softcap=5.0)),
    ((6, 23), torch.float32, dict(weight=True, label_smoothing=0.2, ignored=0.3, z_loss=0.01)),
    ((4, 23), torch.bfloat16, dict(reduction="none", label_smoothing=0.1, softcap=3.0)),
    ((6, 23), torch.float64, dict(label_smoothing=0.3, z_loss=0.05, ignored=0.3)),
    ((3, 23, 2), torch.float32, dict(reduction="none", weight=True, label_smoothing=0.1, ignored=0.3, softcap=4.0)),
    ((23,), torch.float64, dict(z_loss=0.1)),
]


def _inputs(shape, dtype, options, seed):
    """The whole logits, targets and options, the same on every rank."""
    torch.manual_seed(seed)
    options = dict(options)
    n_classes = shape[0] if len(shape) == 1 else shape[1]
    x = (torch.randn(shape) * 3).to(dtype)
    positions = () if len(shape) == 1 else (shape[0], *shape[2:])
    target = torch.randint(0, n_classes, positions)
    ignored = options.pop("ignored", 0.0)
    if ignored:
        target[torch.rand(positions) < ignored] = -100
    if options.pop("weight", False):
        options["weight"] = (torch.rand(n_classes) + 0.5).to(dtype)
    return x, target, options


def _on(device: str, options: dict) -> dict:
    return {name: value.to(device) if isinstance(value, torch.Tensor) else value for name, value in options.items()}


def _check_case(rank: int, world: int, shape, dtype, options, seed: int, device: str) -> None:
    from portable_softmax import distributed

    x, target, options = _inputs(shape, dtype, options, seed)
    sizes = SLICES[world]
    class_dim = 0 if x.dim() == 1 else 1
    local = x.split(sizes, class_dim)[rank].to(device).requires_grad_()
    ours, lse = distributed.cross_entropy(local, target.to(device), return_lse=True, **_on(device, options))
    ours, lse = ours.cpu(), lse.cpu()
    theirs, leaf = reference(x, target, **options)
    tol = TOLERANCE[dtype]
    assert ours.dtype == dtype and ours.shape == theirs.shape
    assert relative_error(ours, theirs) <= tol, f"rank {rank}: loss {relative_error(ours, theirs):.1e}"
    capped = leaf.detach() if options.get("softcap") is None else \
        options["softcap"] * torch.tanh(leaf.detach() / options["softcap"])
    assert relative_error(lse, torch.logsumexp(capped, class_dim)) <= 1e-6, f"rank {rank}: lse"
    torch.manual_seed(seed + 1)
    upstream = torch.randn(theirs.shape).to(dtype)
    ours.backward(upstream)
    theirs.backward(upstream.double())
    expected = leaf.grad.split(sizes, class_dim)[rank]
    assert local.grad.dtype == dtype and local.grad.shape == local.shape
    if local.numel():
        error = relative_error(local.grad.cpu(), expected)
        assert error <= tol, f"rank {rank}: gradient {error:.1e}"


@pytest.mark.parametrize("device, world", GROUPS)
def test_the_loss_of_the_whole_on_every_rank(device, world):
    """Every case's loss, lse and this slice's gradient against torch's of the whole logits."""
    _run(world, _check_each, _check_case, [case + (i, device) for i, case in enumerate(CASES)], device=device)


def _check_special(rank: int, world: int, device: str) -> None:
    """torch's special values: +inf and NaN logits (NaN rows), -inf logits (their classes'
    probability 0), a target of the last class; every target ignored ('mean': NaN, and a zero
    gradient, as ``portable_softmax.cross_entropy``'s: torch's is NaN on the rows holding NaN or
    inf, ignored or not)."""
    from portable_softmax import distributed

    sizes = SLICES[world]
    torch.manual_seed(3)  # the same logits on every rank
    x = torch.randn(5, 23, dtype=torch.float64) * 3
    x[1, 20] = math.inf
    x[2, 2] = math.nan
    x[3, :7] = -math.inf
    target = torch.tensor([22, 0, 4, 10, -100])
    for options, t in ((dict(), target), (dict(reduction="none"), target), (dict(reduction="sum", z_loss=0.1), target),
                       (dict(), torch.full((5,), -100))):
        local = x.split(sizes, 1)[rank].to(device).requires_grad_()
        ours = distributed.cross_entropy(local, t.to(device), **options)
        theirs, leaf = reference(x, t, **options)
        assert torch.equal(ours.detach().cpu().isnan(), theirs.isnan()), f"rank {rank}: {options} NaN where torch's"
        finite = ~theirs.isnan()
        assert torch.allclose(ours.detach().cpu()[finite], theirs[finite], rtol=1e-12), f"rank {rank}: {options}"
        ours.sum().backward()
        theirs.sum().backward()
        ours, grad = ours.detach().cpu(), local.grad.cpu()
        expected = leaf.grad.split(sizes, 1)[rank]
        if (t == -100).all():
            expected = expected.nan_to_num(0.0)
        assert torch.equal(grad.isnan(), expected.isnan()), f"rank {rank}: {options} gradient NaN"
        assert torch.allclose(grad.nan_to_num(), expected.nan_to_num(), rtol=1e-12, atol=1e-15), \
            f"rank {rank}: {options} gradient"
    # No positions: 'mean' is NaN and 'sum' 0, as torch's.
    empty = x[:0].split(sizes, 1)[rank].to(device)
    for reduction in ("mean", "sum"):
        ours = distributed.cross_entropy(empty, target[:0].to(device), reduction=reduction).cpu()
        theirs = torch.nn.functional.cross_entropy(x[:0], target[:0], reduction=reduction)
        assert torch.equal(ours.isnan(), theirs.isnan()) and ours.nan_to_num() == theirs.nan_to_num(), reduction


def _check_errors(rank: int, world: int, device: str) -> None:
    """Errors every rank raises alike (they hold the same targets and weights); on a GPU a target
    outside the classes gives NaN at its position instead (no host synchronisation)."""
    from portable_softmax import distributed

    local = torch.randn(4, SLICES[world][rank], device=device)
    outside = torch.tensor([0, 23, 1, 2], device=device)
    if device != "cpu":
        found = distributed.cross_entropy(local, outside, reduction="none").cpu().isnan()
        assert found.tolist() == [False, True, False, False], f"rank {rank}: {found}"
        return
    with pytest.raises(IndexError, match="out of bounds for 23 classes"):
        distributed.cross_entropy(local, outside)
    with pytest.raises(ValueError, match="weight has 22 values but the slices hold 23"):
        distributed.cross_entropy(local, torch.tensor([0, 1, 1, 2]), torch.ones(22))
    with pytest.raises(NotImplementedError, match="class probabilities"):
        distributed.cross_entropy(local, torch.rand(local.shape))


def _check_both(rank: int, world: int, device: str) -> None:
    _check_special(rank, world, device)
    _check_errors(rank, world, device)


@pytest.mark.parametrize("device, world", GROUPS)
def test_special_values_and_errors(device, world):
    _run(world, _check_both, device, device=device)


def _same(ours: torch.Tensor, theirs: torch.Tensor, tol: float, what: str) -> None:
    """``ours`` is NaN, +inf and -inf where torch's ``theirs`` is, and within ``tol`` of it elsewhere."""
    ours, theirs = ours.detach().cpu().double(), theirs.detach().double()
    assert torch.equal(ours.isnan(), theirs.isnan()), \
        f"{what}: NaN {ours.isnan().tolist()}, torch's {theirs.isnan().tolist()}"
    infinite = theirs.isinf()
    assert torch.equal(ours.isinf(), infinite) and torch.equal(ours[infinite], theirs[infinite]), \
        f"{what}: {ours.tolist()}, torch's {theirs.tolist()}"
    finite = theirs.isfinite()
    error = relative_error(ours[finite], theirs[finite])
    assert error <= tol, f"{what}: {error:.1e}"


def _check_infinities(rank: int, world: int, device: str) -> None:
    """Rows holding +inf: their lse +inf as torch's logsumexp of the whole row (NaN with a NaN in
    it too), where the slices' lse merged against the row's maximum, exp(inf - inf), gave NaN
    until 2026-11-28; a counted one's loss and gradient NaN throughout, as torch's (its target's
    column too, which the backward writes apart); an ignored one's loss and gradient 0 (torch's
    gradient there is NaN: ``test_loss.test_ignored_rows_of_infinite_logits_have_a_zero_gradient``).
    Each class weight, smoothing (weighted too) and z-loss form of the merge, every reduction."""
    from portable_softmax import distributed

    inf, nan = math.inf, math.nan
    sizes = SLICES[world]  # 2 ranks: classes 0-8 and 9-22; 3 ranks: 0-4, none, 5-22
    torch.manual_seed(11)
    x = torch.randn(10, 23) * 3
    x[0, 3] = inf  # in the first slice, the target in the last
    x[1, 20] = inf  # in the last slice, the target in the first
    x[2, 1], x[2, 12] = inf, inf  # in two slices
    x[3, 4], x[3, 18] = inf, nan  # beside a NaN in another slice
    x[4, 10], x[4, 11] = nan, inf  # beside a NaN in its own slice
    x[5] = -inf  # -inf only: lse -inf, loss and gradient NaN
    x[6, 6] = inf  # ignored
    x[7, 16] = inf  # at the target's column
    x[9, :9], x[9, 21] = -inf, inf  # a first slice of -inf only, +inf in the last
    target = torch.tensor([15, 2, 5, 7, 0, 8, -100, 16, 22, 12])
    weight = torch.rand(23) + 0.5
    lse_theirs = torch.logsumexp(x.double(), 1)
    variants = [dict(reduction=r) for r in ("none", "sum", "mean")] + [
        dict(reduction="none", weight=weight), dict(reduction="none", label_smoothing=0.1),
        dict(reduction="none", z_loss=0.01), dict(reduction="none", weight=weight, label_smoothing=0.2, z_loss=0.01),
        dict(reduction="mean", weight=weight, label_smoothing=0.1, z_loss=0.01)]
    for options in variants:
        what = f"rank {rank}: {dict(options, weight=options.get('weight') is not None)}"
        local = x.split(sizes, 1)[rank].to(device).requires_grad_()
        ours, lse = distributed.cross_entropy(local, target.to(device), return_lse=True, **_on(device, options))
        theirs, leaf = reference(x, target, **options)
        _same(lse, lse_theirs, 1e-6, f"{what} lse")
        _same(ours, theirs, TOLERANCE[torch.float32], f"{what} loss")
        ours.backward(torch.ones_like(ours))
        theirs.backward(torch.ones_like(theirs))
        expected = leaf.grad.split(sizes, 1)[rank].clone()
        expected[target == -100] = 0.0
        if local.numel():
            _same(local.grad, expected, TOLERANCE[torch.float32], f"{what} gradient")


@pytest.mark.parametrize("device, world", GROUPS)
def test_rows_holding_infinities_are_torchs(device, world):
    _run(world, _check_infinities, device, device=device)


def _check_dtensor(rank: int, world: int, device: str) -> None:
    """``portable_softmax.cross_entropy`` of DTensor logits sharded on the classes (torch's even
    shards: 12, 11) against torch's ``loss_parallel`` of the same DTensor: the loss, its
    placements and the logits' gradient; sharded on the batch instead, torch's own loss."""
    import torch.nn.functional as F
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard, distribute_tensor
    from torch.distributed.tensor.parallel import loss_parallel

    import portable_softmax as ps

    mesh = init_device_mesh(device, (world,))
    torch.manual_seed(5)
    x = (torch.randn(6, 23, dtype=torch.float64) * 3).to(device)
    counted = torch.randint(0, 23, (6,)).to(device)
    target = counted.clone()
    target[::4] = -100
    weight = (torch.rand(23, dtype=torch.float64) + 0.5).to(device)
    # torch 2.13's loss_parallel backward fails with a weight and ignored targets (it gathers the
    # weight at -100): weighted cases count every target.
    for reduction, w, t in (("mean", None, target), ("sum", weight, counted), ("none", weight, counted)):
        ours_x = distribute_tensor(x, mesh, [Shard(1)]).requires_grad_()
        ours = ps.cross_entropy(ours_x, t, w, reduction=reduction)
        theirs_x = distribute_tensor(x, mesh, [Shard(1)]).requires_grad_()
        with loss_parallel():
            theirs = F.cross_entropy(theirs_x, t, w, reduction=reduction)
            theirs.sum().backward()
        ours.sum().backward()
        assert isinstance(ours, DTensor) and ours.placements == theirs.placements, f"{reduction}: placements"
        assert relative_error(ours.full_tensor(), theirs.full_tensor()) < 1e-12, f"rank {rank}: {reduction}"
        # Only the local slice's gradient is written: it stays sharded as the logits are, as torch's
        # (torch 2.11 on CUDA had replicated ours in the accumulation: distributed_dtensor._LocalLogits).
        assert ours_x.grad.placements == theirs_x.grad.placements == (Shard(1),), (
            f"{reduction}: {ours_x.grad.placements}, torch's {theirs_x.grad.placements}")
        assert relative_error(ours_x.grad.full_tensor(), theirs_x.grad.full_tensor()) < 1e-12, f"{reduction}: grad"
    # Options torch's loss_parallel lacks, on the shards: against the whole logits' loss.
    ours = ps.cross_entropy(distribute_tensor(x, mesh, [Shard(1)]), target, label_smoothing=0.1, z_loss=0.01,
                            softcap=4.0)
    theirs, _ = reference(x.cpu(), target.cpu(), label_smoothing=0.1, z_loss=0.01, softcap=4.0)
    assert relative_error(ours.full_tensor().cpu(), theirs) < 1e-12
    # Sharded on the batch: torch's own cross-entropy of the DTensor.
    batch = distribute_tensor(x, mesh, [Shard(0)])
    ours = ps.cross_entropy(batch, distribute_tensor(target, mesh, [Shard(0)]))
    assert relative_error(ours.full_tensor(), F.cross_entropy(x, target)) < 1e-12
    with pytest.raises(NotImplementedError, match="sharded on the class dimension"):
        ps.cross_entropy(batch, distribute_tensor(target, mesh, [Shard(0)]), z_loss=0.1)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=GROUPS[2].marks)])
def test_dtensors_sharded_on_the_classes_follow_loss_parallel(device):
    _run(2, _check_dtensor, device, device=device)


# (hidden's shape, dtype, with a bias, options) of the tensor-parallel head: 23 classes sliced.
# chunk_bytes of the largest slice's logits: one token a chunk; 4 and 2 tokens (2 ranks, float32);
# one chunk (the default); 3 and 1 tokens (2 ranks, bf16).
HEAD_CASES = [
    ((6, 16), torch.float64, True, dict(weight=True, label_smoothing=0.1, ignored=0.3, softcap=3.0, chunk_bytes=1)),
    ((2, 3, 16), torch.float32, False, dict(reduction="none", z_loss=0.01, softcap=4.0, chunk_bytes=250)),
    ((5, 16), torch.float64, True, dict(reduction="sum", label_smoothing=0.2, z_loss=0.1)),
    ((4, 16), torch.bfloat16, True, dict(chunk_bytes=100)),
]


def _check_head(rank: int, world: int, shape, dtype, bias: bool, options, seed: int, device: str) -> None:
    """``distributed.linear_cross_entropy`` against torch's loss of ``hidden @ weight.T + bias`` of
    the whole weight in float64: the loss, hidden's whole gradient on every rank, this slice's
    of the weight and bias."""
    from portable_softmax import distributed

    torch.manual_seed(seed)
    sizes = SLICES[world]
    hidden = (torch.randn(shape) / 2).to(dtype)
    weight = torch.randn(23, shape[-1]).to(dtype)
    full_bias = torch.randn(23).to(dtype) if bias else None
    target = torch.randint(0, 23, shape[:-1])
    options = dict(options)
    if options.pop("ignored", 0.0):
        target[torch.rand(shape[:-1]) < 0.3] = -100
    if options.pop("weight", False):
        options["class_weight"] = torch.rand(23).to(dtype) + 0.5
    ours_hidden = hidden.to(device).requires_grad_()
    local_weight = weight.split(sizes)[rank].to(device).requires_grad_()
    local_bias = full_bias.split(sizes)[rank].to(device).requires_grad_() if bias else None
    ours = distributed.linear_cross_entropy(ours_hidden, local_weight, target.to(device), local_bias,
                                            **_on(device, options))
    leaves = [t.detach().double().requires_grad_() for t in (hidden, weight) + ((full_bias,) if bias else ())]
    logits = torch.nn.functional.linear(*leaves).movedim(-1, 1)
    class_weight = options.pop("class_weight", None)
    options.pop("chunk_bytes", None)
    theirs, logits_leaf = reference(logits.detach(), target, class_weight, **options)
    tol = TOLERANCE[dtype]
    assert ours.dtype == dtype and ours.shape == theirs.shape
    assert relative_error(ours.cpu(), theirs) <= tol, f"rank {rank}: loss {relative_error(ours.cpu(), theirs):.1e}"
    torch.manual_seed(seed + 1)
    upstream = torch.randn(theirs.shape).to(dtype)
    ours.backward(upstream.to(device))
    theirs.backward(upstream.double())
    logits.backward(logits_leaf.grad)
    expected = [leaves[0].grad, leaves[1].grad.split(sizes)[rank]] + ([leaves[2].grad.split(sizes)[rank]] if bias else [])
    found = [t.grad.cpu() for t in (ours_hidden, local_weight) + ((local_bias,) if bias else ())]
    for name, got, want in zip(("hidden", "weight", "bias"), found, expected):
        assert got.dtype == dtype and got.shape == want.shape, f"rank {rank}: {name}"
        if want.numel():
            assert relative_error(got, want) <= tol, f"rank {rank}: {name} {relative_error(got, want):.1e}"


@pytest.mark.parametrize("device, world", GROUPS)
def test_the_tensor_parallel_head(device, world):
    _run(world, _check_each, _check_head, [case + (i, device) for i, case in enumerate(HEAD_CASES)], device=device)


def _check_head_in_one_chunk(rank: int, world: int) -> None:
    """A bf16 head whose tokens fit one chunk makes no float32 buffer of its weight slice's shape
    (one matmul, float32 inside, rounded once), and still matches torch; several chunks make one."""
    from portable_softmax import distributed

    for chunk_bytes, wide_buffers in ((None, 0), (100, 1)):
        _check_head(rank, world, (5, 16), torch.bfloat16, True,
                    {} if chunk_bytes is None else {"chunk_bytes": chunk_bytes}, 7, "cpu")
        torch.manual_seed(3)
        hidden = torch.randn(5, 16).to(torch.bfloat16).requires_grad_()
        weight = torch.randn(23, 16).to(torch.bfloat16).split(SLICES[world])[rank].clone().requires_grad_()
        target = torch.randint(0, 23, (5,))
        with FloatBuffers(weight.shape) as wide:
            distributed.linear_cross_entropy(hidden, weight, target, chunk_bytes=chunk_bytes).backward()
        assert (wide.count > 0) == bool(wide_buffers), (rank, chunk_bytes, wide.count)


def test_the_tensor_parallel_head_in_one_chunk():
    _run(2, _check_head_in_one_chunk, device="cpu")


# The torch ops a repeated call with the default options dispatches on each rank, the launches
# stubbed (2026-11-28, benchmarks/probes/vocab_parallel_host_ops.py, 2 ranks): 31 in the forward
# (no grad), 44 forward + backward (the engine's seed and accumulation included), where the path
# before made 74 and 115. Each is some microseconds of host time on a GPU, where the step's GPU
# work is short enough that they are its time (issue 33). Then one more in each (v40a: 32 and 45):
# z_t + M * 0 (``addcmul_``), NaN where a row's maximum is +inf, whose lse is now +inf as torch's
# (its reference 0): without it the loss, lse - z_t, would be +inf and the gradient's target column,
# from exp(z_t - lse) = 0, finite, where torch's are NaN; a test of lse != inf in the loss's
# ``where`` would have taken two ops and left that column finite.
FORWARD_OPS = 32
TRAINING_OPS = 45


def _check_op_count(rank: int, world: int) -> None:
    from portable_softmax import distributed, distributed_loss, launch

    launches = []
    launch.LaunchRecord._launch = lambda self, tensors: launches.append(self) or self.plan
    # The CPU-only checks (they read C on the host; an accelerator's call has none) left out.
    distributed_loss._check = lambda *args: None
    torch.manual_seed(0)
    x = torch.randn(4, SLICES[world][rank] + 100, requires_grad=True)
    target = torch.randint(0, 200, (4,))

    def train() -> None:
        x.grad = None
        distributed.cross_entropy(x, target).backward()

    def forward() -> None:
        with torch.no_grad():
            distributed.cross_entropy(x, target)

    # Launches: the slice's loss rows and the loss's sum (``cross_entropy_sum``), and in training the
    # gradient's.
    for step, most, records in ((forward, FORWARD_OPS, 2), (train, TRAINING_OPS, 3)):
        step()  # the first call plans and keeps its constants
        launches.clear()
        with DispatchedOps() as ops:
            step()
        assert len(ops.names) <= most, f"rank {rank}: {len(ops.names)} ops, at most {most}: {ops.names}"
        assert ops.collectives == 2 and len(launches) == records, (ops.collectives, launches)


def test_a_repeated_call_dispatches_few_ops():
    _run(2, _check_op_count)
