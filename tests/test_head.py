"""portable_softmax.linear_cross_entropy against torch in float64.

Each case compares the loss and the gradients of hidden, weight and bias (relative error of the
whole tensor) with torch's ``F.cross_entropy(hidden @ weight.T + bias, ...)`` of the same values
in float64, the z-loss and softcap as their torch composites. Cases pair options, with budgets
that cut the tokens into many chunks, the last one short. Shapes are small: every kernel runs
through Triton's interpreter on the CPU.
"""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import portable_softmax as ps
from portable_softmax import head_chunks, head_ops
from portable_softmax.selfcheck import relative_error
from dispatch_counts import FloatBuffers

# The gradients' tolerance: each is a product of rounded factors (the logits' gradient rounded
# to the dtype once, then a matmul), a little looser than the loss's own.
TOLERANCE = {torch.float64: 1e-12, torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2}


def reference(hidden, weight, target, bias=None, class_weight=None, ignore_index=-100, reduction="mean",
              label_smoothing=0.0, z_loss=0.0, softcap=None):
    """torch's loss of ``hidden @ weight.T + bias`` in float64 (float64 leaves of the inputs), the
    z-loss and softcap as their definitions compose; returns the loss and the leaves."""
    leaves = [t.detach().double().requires_grad_() if t is not None else None for t in (hidden, weight, bias)]
    h, w, b = leaves
    z = h.reshape(-1, h.shape[-1]) @ w.T + (b if b is not None else 0)
    if softcap is not None:
        z = softcap * torch.tanh(z / softcap)
    t = target.reshape(-1).long()
    cw = class_weight.double() if class_weight is not None else None
    loss = F.cross_entropy(z, t, cw, ignore_index=ignore_index, reduction=reduction, label_smoothing=label_smoothing)
    if z_loss:
        counted = (t != ignore_index).double()
        extra = z_loss * torch.logsumexp(z, 1) ** 2 * counted
        reduce = {"mean": lambda e: e.sum() / counted.sum(), "sum": torch.sum, "none": lambda e: e}[reduction]
        loss = loss + reduce(extra)
    return (loss.reshape(target.shape) if reduction == "none" else loss), leaves


def make(leading, features, n_classes, dtype, device, bias=False, ignored=0.0, class_weight=False):
    hidden = torch.randn(*leading, features, device=device).to(dtype)
    # Logits of about unit spread: weight ~ 1/sqrt(H), as a trained head's.
    weight = (torch.randn(n_classes, features, device=device) * (2.0 / math.sqrt(features))).to(dtype)
    target = torch.randint(0, n_classes, leading, device=device)
    if ignored:
        target[torch.rand(leading, device=device) < ignored] = -100
    extra = {}
    if bias:
        extra["bias"] = torch.randn(n_classes, device=device).to(dtype)
    if class_weight:
        extra["class_weight"] = torch.rand(n_classes, device=device, dtype=dtype) + 0.5
    return hidden, weight, target, extra


def check(hidden, weight, target, grad_output=None, tol=None, **options):
    """Our loss and the three gradients against ``reference``'s, within the dtype's tolerance."""
    tol = tol or TOLERANCE[hidden.dtype]
    bias = options.pop("bias", None)
    ours_in = [t.detach().clone().requires_grad_() if t is not None else None for t in (hidden, weight, bias)]
    ours = ps.linear_cross_entropy(ours_in[0], ours_in[1], target, ours_in[2], **options)
    reference_options = {k: v for k, v in options.items() if k not in ("chunk_bytes", "accumulate_dtype")}
    theirs, leaves = reference(hidden, weight, target, bias, **reference_options)
    assert ours.dtype == hidden.dtype and ours.shape == theirs.shape
    assert relative_error(ours, theirs) <= tol, (relative_error(ours, theirs), options)
    upstream = torch.randn_like(theirs) if grad_output is None else grad_output
    ours.backward(upstream.to(ours.dtype))
    theirs.backward(upstream.to(ours.dtype).double())
    for name, mine, leaf in zip(("hidden", "weight", "bias"), ours_in, leaves):
        if mine is None:
            continue
        assert mine.grad.dtype == mine.dtype and mine.grad.shape == mine.shape
        error = relative_error(mine.grad, leaf.grad)
        assert error <= tol, (name, error, options)
    return ours, [t.grad if t is not None else None for t in ours_in]


def tokens_per_chunk(tokens, n_classes, dtype):
    """A budget of ``tokens`` rows of logits."""
    return tokens * n_classes * torch.empty((), dtype=dtype).element_size()


# (leading dims, H, V, dtype, options, tokens per chunk (None: the default budget, one chunk)).
CASES = [
    pytest.param((3, 7), 16, 97, torch.float32, dict(bias=True, ignored=0.3), 5, id="fp32-leading-bias-ignored-5"),
    pytest.param((29,), 24, 301, torch.bfloat16, dict(reduction="sum", label_smoothing=0.1, class_weight=True), 4,
                 id="bf16-sum-smoothing-class_weight-4"),
    pytest.param((2, 9), 16, 130, torch.float64, dict(reduction="none", z_loss=0.01, softcap=3.0, bias=True), 4,
                 id="fp64-none-zloss-softcap-bias-4"),
    pytest.param((13,), 32, 257, torch.float16, dict(ignored=0.4, z_loss=1e-3, softcap=5.0), None,
                 id="fp16-zloss-softcap-ignored-one-chunk"),
    pytest.param((4, 5), 16, 64, torch.float32,
                 dict(reduction="none", class_weight=True, label_smoothing=0.2, ignored=0.3, bias=True), 3,
                 id="fp32-none-class_weight-smoothing-ignored-bias-3"),
    pytest.param((23,), 16, 111, torch.float32,
                 dict(class_weight=True, label_smoothing=0.15, ignored=0.3, z_loss=0.02, softcap=6.0, bias=True), 6,
                 id="fp32-mean-every-option-6"),
    pytest.param((2, 11), 32, 150, torch.bfloat16, dict(reduction="none", bias=True, ignored=0.2), 8,
                 id="bf16-none-bias-8"),
    pytest.param((17,), 16, 80, torch.float32, dict(reduction="sum", z_loss=0.05), 1, id="fp32-sum-zloss-1"),
]


@pytest.mark.parametrize("leading, features, n_classes, dtype, options, tokens", CASES)
def test_matches_torch(device, leading, features, n_classes, dtype, options, tokens):
    options = dict(options)
    hidden, weight, target, extra = make(leading, features, n_classes, dtype, device, options.pop("bias", False),
                                         options.pop("ignored", 0.0), options.pop("class_weight", False))
    if tokens is not None:
        options["chunk_bytes"] = tokens_per_chunk(tokens, n_classes, dtype)
    # A scalar incoming gradient other than 1 (reduced), one per position ('none').
    grad_output = torch.tensor(2.5, device=device) if options.get("reduction", "mean") != "none" else None
    check(hidden, weight, target, grad_output, **extra, **options)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_many_chunks_as_one(device, dtype):
    # A budget of one token per chunk, and one chunk of all 19: each as torch's.
    hidden, weight, target, extra = make((19,), 16, 90, dtype, device, bias=True, ignored=0.2)
    for tokens in (1, 19):
        check(hidden, weight, target, torch.tensor(0.7, device=device), chunk_bytes=tokens_per_chunk(tokens, 90, dtype),
              **dict(extra))


def test_none_weighs_each_row_of_the_weight_gradient(device):
    # 'none' with an incoming gradient that is zero, negative and large on different tokens: the
    # weight's gradient is sum_i g_i dz_i^T h_i, which no rescale after the sum gives.
    hidden, weight, target, _ = make((12,), 16, 70, torch.float32, device, ignored=0.2)
    grad_output = torch.tensor([0.0, -3.0, 1.0, 10.0, 0.5, 0.0, 2.0, -1.0, 0.25, 4.0, -0.5, 1.5], device=device)
    check(hidden, weight, target, grad_output, reduction="none", chunk_bytes=tokens_per_chunk(5, 70, torch.float32))


def test_weight_gradient_kept_in_the_weight_dtype(device):
    hidden, weight, target, extra = make((21,), 16, 120, torch.bfloat16, device, bias=True)
    _, grads = check(hidden, weight, target, accumulate_dtype=torch.bfloat16,
                     chunk_bytes=tokens_per_chunk(4, 120, torch.bfloat16), **extra)
    assert grads[1].dtype == torch.bfloat16


@pytest.mark.parametrize("tokens", [4, 21], ids=["chunks", "one-chunk"])
def test_one_chunk_needs_no_float32_weight_gradient(device, tokens):
    # All tokens in one chunk: the weight's gradient is one matmul, summed in float32 inside it and
    # rounded once, so no float32 copy of the weight is made (eager); several chunks sum in one.
    hidden, weight, target, extra = make((21,), 16, 120, torch.bfloat16, device, bias=True)
    with FloatBuffers(weight.shape) as wide:
        _, grads = check(hidden, weight, target, chunk_bytes=tokens_per_chunk(tokens, 120, torch.bfloat16), **extra)
    assert grads[1].dtype == torch.bfloat16
    assert (wide.count == 0) == (tokens == 21), wide.count


def test_same_bits_every_run(device):
    hidden, weight, target, extra = make((33,), 32, 200, torch.bfloat16, device, bias=True, ignored=0.1)
    budget = tokens_per_chunk(7, 200, torch.bfloat16)
    runs = []
    for _ in range(2):
        leaves = [t.detach().clone().requires_grad_() for t in (hidden, weight, extra["bias"])]
        loss = ps.linear_cross_entropy(leaves[0], leaves[1], target, leaves[2], chunk_bytes=budget)
        loss.backward()
        runs.append([loss.detach()] + [t.grad for t in leaves])
    assert all(torch.equal(a, b) for a, b in zip(*runs))


def test_every_target_ignored(device):
    hidden, weight, _, extra = make((6,), 16, 40, torch.float32, device, bias=True)
    target = torch.full((6,), -100, device=device)
    leaves = [t.detach().clone().requires_grad_() for t in (hidden, weight, extra["bias"])]
    ours = ps.linear_cross_entropy(leaves[0], leaves[1], target, leaves[2])
    theirs, their_leaves = reference(hidden, weight, target, extra["bias"])
    assert torch.isnan(ours) and torch.isnan(theirs)
    # torch's gradient of a mean over nothing: 0 / 0 per term, as ours.
    ours.backward()
    theirs.backward()
    for mine, leaf in zip(leaves, their_leaves):
        assert torch.equal(torch.isnan(mine.grad), torch.isnan(leaf.grad))
    assert ps.linear_cross_entropy(hidden, weight, target, reduction="sum").item() == 0.0
    assert torch.equal(ps.linear_cross_entropy(hidden, weight, target, reduction="none"), torch.zeros(6, device=device))


def test_no_tokens(device):
    hidden = torch.randn(0, 16, device=device, requires_grad=True)
    weight = torch.randn(40, 16, device=device, requires_grad=True)
    target = torch.zeros(0, dtype=torch.long, device=device)
    assert torch.isnan(ps.linear_cross_entropy(hidden, weight, target))
    loss = ps.linear_cross_entropy(hidden, weight, target, reduction="sum")
    loss.backward()
    assert loss.item() == 0.0 and hidden.grad.shape == (0, 16)
    assert torch.equal(weight.grad, torch.zeros_like(weight))


def test_return_lse_and_no_grad(device):
    hidden, weight, target, extra = make((3, 4), 16, 50, torch.bfloat16, device, bias=True)
    with torch.no_grad():
        loss, lse = ps.linear_cross_entropy(hidden, weight, target, **extra, softcap=2.0, return_lse=True,
                                            chunk_bytes=tokens_per_chunk(5, 50, torch.bfloat16))
    assert lse.dtype == torch.float32 and lse.shape == target.shape and not lse.requires_grad
    z = (hidden.double() @ weight.double().T + extra["bias"].double()).to(torch.bfloat16).double()
    assert relative_error(lse, torch.logsumexp(2.0 * torch.tanh(z / 2.0), -1)) < 1e-6
    assert relative_error(loss, reference(hidden, weight, target, extra["bias"], softcap=2.0)[0]) <= 1e-2


def test_frozen_weight(device):
    # LoRA-like: the head frozen, hidden's gradient alone.
    hidden, weight, target, _ = make((9,), 16, 60, torch.float32, device)
    leaf = hidden.clone().requires_grad_()
    ps.linear_cross_entropy(leaf, weight, target).backward()
    theirs, leaves = reference(hidden, weight, target)
    theirs.backward()
    assert weight.grad is None and relative_error(leaf.grad, leaves[0].grad) <= TOLERANCE[torch.float32]


def test_second_backward_raises(device):
    hidden, weight, target, _ = make((5,), 16, 30, torch.float32, device)
    leaf = hidden.clone().requires_grad_()
    loss = ps.linear_cross_entropy(leaf, weight, target)
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="second backward"):
        loss.backward()


def test_autocast_as_torch(device):
    if not torch.amp.is_autocast_available(device):
        pytest.skip(f"no autocast for {device}")
    hidden, weight, target, _ = make((6,), 16, 40, torch.float32, device)
    leaf = hidden.clone().requires_grad_()
    with torch.autocast(device, dtype=torch.bfloat16):
        ours = ps.linear_cross_entropy(leaf, weight, target)
        theirs = F.cross_entropy(F.linear(hidden, weight), target)
    assert ours.dtype == theirs.dtype
    ours.backward()
    assert leaf.grad.dtype == torch.float32
    cast = [t.to(torch.bfloat16) for t in (hidden, weight)]
    assert relative_error(ours, reference(*cast, target)[0]) <= TOLERANCE[torch.bfloat16]


def test_meta_tensors():
    hidden = torch.empty(2, 8, 64, device="meta", dtype=torch.bfloat16)
    weight = torch.empty(50257, 64, device="meta", dtype=torch.bfloat16)
    target = torch.empty(2, 8, device="meta", dtype=torch.long)
    loss, lse = ps.linear_cross_entropy(hidden, weight, target, return_lse=True)
    assert loss.shape == () and loss.dtype == torch.bfloat16 and lse.shape == (2, 8) and lse.dtype == torch.float32
    assert ps.linear_cross_entropy(hidden, weight, target, reduction="none").shape == (2, 8)


@pytest.mark.skipif(not head_ops.AVAILABLE, reason="torch.library.custom_op needs torch >= 2.4")
@pytest.mark.parametrize("reduction, dtype", [("mean", torch.float32), ("none", torch.float32),
                                              ("sum", torch.bfloat16)], ids=["mean-fp32", "none-fp32", "sum-bf16"])
def test_torch_compile_fullgraph(device, reduction, dtype):
    # bfloat16: the weight's gradient summed in float32, scaled and cast in the backward.
    import torch._dynamo

    torch._dynamo.reset()
    hidden, weight, target, extra = make((2, 5), 16, 70, dtype, device, bias=True, ignored=0.2)
    budget = tokens_per_chunk(3, 70, dtype)

    def weighed(loss):
        # An incoming gradient other than 1: 3 (reduced), 3 * (1, 2, ...) per token ('none').
        return (loss * torch.arange(1, loss.numel() + 1, device=loss.device).reshape(loss.shape)).sum() * 3

    def step(hidden, weight, bias, target):
        loss, lse = ps.linear_cross_entropy(hidden, weight, target, bias, reduction=reduction, z_loss=0.01,
                                            return_lse=True, chunk_bytes=budget)
        return weighed(loss), lse

    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    ours = [t.clone().requires_grad_() for t in (hidden, weight, extra["bias"])]
    loss, lse = compiled(*ours, target)
    loss.backward()
    expected, leaves = reference(hidden, weight, target, extra["bias"], reduction=reduction, z_loss=0.01)
    weighed(expected).backward()
    assert relative_error(loss, weighed(expected)) <= TOLERANCE[dtype]
    assert relative_error(lse, torch.logsumexp(leaves[0] @ leaves[1].T + leaves[2], -1)) <= TOLERANCE[dtype]
    for mine, leaf in zip(ours, leaves):
        assert mine.grad.dtype == dtype and relative_error(mine.grad, leaf.grad) <= TOLERANCE[dtype]


def test_graph_capture(device):
    if device != "cuda":
        pytest.skip("CUDA graphs: cuda only")
    hidden, weight, target, extra = make((300,), 64, 32001, torch.bfloat16, device, bias=True, ignored=0.1)
    leaves = [t.clone().requires_grad_() for t in (hidden, weight, extra["bias"])]
    budget = tokens_per_chunk(128, 32001, torch.bfloat16)

    def step():
        ps.linear_cross_entropy(leaves[0], leaves[1], target, leaves[2], label_smoothing=0.1,
                                chunk_bytes=budget).backward()

    for _ in range(2):  # warm up: compile and plan before capture
        step()
    for t in leaves:
        t.grad = None
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        loss = ps.linear_cross_entropy(leaves[0], leaves[1], target, leaves[2], label_smoothing=0.1,
                                       chunk_bytes=budget)
        loss.backward()
    fresh = make((300,), 64, 32001, torch.bfloat16, device, bias=True)
    with torch.no_grad():
        for t, new in zip(leaves, (fresh[0], fresh[1], fresh[3]["bias"])):
            t.copy_(new)
    graph.replay()
    theirs, refs = reference(leaves[0], leaves[1], target, leaves[2], label_smoothing=0.1)
    theirs.backward()
    assert relative_error(loss, theirs) <= TOLERANCE[torch.bfloat16]
    for mine, ref in zip(leaves, refs):
        assert relative_error(mine.grad, ref.grad) <= TOLERANCE[torch.bfloat16]


def test_peak_memory(device):
    # Beyond the inputs and their gradients: one chunk of logits, the float32 weight gradient,
    # O(N). torch's own head would hold the (N, V) logits and their gradient: 8x the chunk here.
    if device != "cuda":
        pytest.skip("the caching allocator's peak: cuda only")
    n_rows, features, n_classes = 4096, 512, 32000
    hidden, weight, target, _ = make((n_rows,), features, n_classes, torch.bfloat16, device)
    hidden.requires_grad_(), weight.requires_grad_()
    budget = tokens_per_chunk(512, n_classes, torch.bfloat16)
    ps.linear_cross_entropy(hidden, weight, target, chunk_bytes=budget).backward()
    hidden.grad = weight.grad = None
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    ps.linear_cross_entropy(hidden, weight, target, chunk_bytes=budget).backward()
    torch.cuda.synchronize()
    extra = torch.cuda.max_memory_allocated() - base
    gradients = (hidden.numel() + weight.numel()) * 2
    bound = budget + weight.numel() * 4 + gradients + 64 * n_rows + (1 << 20)
    assert extra <= bound, (extra / 2**20, bound / 2**20)


def test_chunk_rows_from_the_budget():
    # From the budget and the vocabulary alone: a multiple of 128 above 128, at least one token.
    assert head_chunks.chunk_rows(16384, 128256, 2, 1 << 30) == 4096
    assert head_chunks.chunk_rows(100, 128256, 2, 1 << 30) == 100
    assert head_chunks.chunk_rows(16384, 128256, 2, 1) == 1
    assert head_chunks.chunk_rows(16384, 1000, 4, 100 * 4000) == 100
    assert head_chunks.chunk_rows(0, 1000, 4, 1 << 30) == 1


def test_default_budget(device):
    where = torch.empty(0, device=device).device
    assert 0 < head_chunks.budget(where, None) <= head_chunks.CHUNK_LIMIT_BYTES
    assert head_chunks.budget(where, 12345) == 12345


@pytest.mark.parametrize("call, error, match", [
    (lambda h, w, t: ps.linear_cross_entropy(h, w.t(), t), ValueError, r"weight must have shape \(V, 8\)"),
    (lambda h, w, t: ps.linear_cross_entropy(h, w.double(), t), TypeError, "weight must have hidden's dtype"),
    (lambda h, w, t: ps.linear_cross_entropy(h, w, t, torch.zeros(3)), ValueError, r"bias must be .* \(5,\)"),
    (lambda h, w, t: ps.linear_cross_entropy(h, w, t, class_weight=torch.ones(4)), ValueError, "class_weight"),
    (lambda h, w, t: ps.linear_cross_entropy(h, w, t.float()), TypeError, "target must hold class indices"),
    (lambda h, w, t: ps.linear_cross_entropy(h, w, t[:2]), ValueError, r"target must have shape \(4,\)"),
    (lambda h, w, t: ps.linear_cross_entropy(h, w, t, chunk_bytes=0), ValueError, "chunk_bytes"),
    (lambda h, w, t: ps.linear_cross_entropy(h, w, t, accumulate_dtype=torch.float16), ValueError,
     "accumulate_dtype"),
    (lambda h, w, t: ps.linear_cross_entropy(h, w, t, reduction="avg"), ValueError, "reduction must be one of"),
    (lambda h, w, t: ps.linear_cross_entropy(h, w, t, label_smoothing=2.0), ValueError, "label_smoothing"),
    (lambda h, w, t: ps.linear_cross_entropy(h.long(), w, t), TypeError, "hidden must be a float16"),
])
def test_errors_name_the_argument(call, error, match):
    hidden, weight = torch.randn(4, 8), torch.randn(5, 8)
    with pytest.raises(error, match=match):
        call(hidden, weight, torch.tensor([0, 1, 4, -100]))


def test_target_out_of_range_raises_on_cpu():
    with pytest.raises(IndexError, match="target 5 is out of bounds for 5 classes"):
        ps.linear_cross_entropy(torch.randn(3, 8), torch.randn(5, 8), torch.tensor([0, 5, -100]))
