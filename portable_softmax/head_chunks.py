"""The chunked work of ``head.linear_cross_entropy``: the loss of ``hidden @ weight.T + bias``
over chunks of tokens, never all the logits at once.

Per chunk of tokens (``chunk_rows`` of them, from a memory budget): the logits by the vendor's
BLAS (``torch.mm`` / ``torch.addmm`` into one buffer kept for the call), then the cross-entropy
forward kernel (``loss_rows.launch_forward``) writes the loss rows and lse of the chunk and, where
a gradient is wanted, the gradient of the chunk's logits over the logits themselves (float32
math, rounded once). From that gradient, still in the forward: the chunk's rows of the hidden
states' gradient (``grad_logits @ weight``), and the weight's and bias's gradients accumulated
over the chunks in float32 (``accumulate_dtype``). The reduction's values are formed once, on the
device, from the whole target (``loss_reduction.stats``): a chunk's 'mean' divides by the
denominator of the whole batch, so the chunks' gradients add up to the whole's, and the loss rows
are summed once at the end, as ``cross_entropy`` sums them.

With ``reduction='none'`` the incoming gradient differs per position and weighs each row of the
weight's gradient, which the forward cannot know: the forward keeps lse alone, and the backward
(``backward``) recomputes each chunk's logits and their gradient times the incoming one (the loss
backward kernel), then the same three products.

The order of every sum is fixed by the chunks (no atomics): the same inputs and budget give the
same bits. No host synchronisation: the budget reads the free device memory from the driver,
which does not wait for the device, and the denominators stay on it.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import NamedTuple, Optional

import torch

from portable_softmax import loss_arguments, loss_reduction, loss_rows
from portable_softmax.loss_arguments import Options

CHUNK_LIMIT_BYTES = 1 << 30
"""The default budget of one chunk's logits: at most 1 GiB ..."""
FREE_MEMORY_SHARE = 16
"""... and at most 1/16 of the device memory free (the driver's, and the caching allocator's
unused blocks)."""
ROW_MULTIPLE = 128
"""Chunks of more than this many tokens are a multiple of it: whole tiles for the matmuls."""

# The budget of the last call per device, for calls made while a CUDA graph is captured (the
# driver is not asked then: the captured chunks are those of the calls that warmed it up).
_last_budget: dict[torch.device, int] = {}


@dataclass(frozen=True)
class HeadCall:
    """A validated call's settings (hashable)."""

    options: Options
    chunk_bytes: Optional[int]
    accumulate_dtype: torch.dtype
    loss_dtype: torch.dtype
    grad_hidden: bool
    grad_weight: bool
    grad_bias: bool

    @property
    def wants_grad(self) -> bool:
        return self.grad_hidden or self.grad_weight or self.grad_bias

    @property
    def grad_in_forward(self) -> bool:
        """Whether the forward forms the gradients (a reduced loss: the backward only rescales)."""
        return self.wants_grad and self.options.reduction != "none"


class Gradients(NamedTuple):
    """The gradients of hidden (its dtype), weight and bias (``accumulate_dtype``); None where
    not wanted."""

    hidden: Optional[torch.Tensor]
    weight: Optional[torch.Tensor]
    bias: Optional[torch.Tensor]


def chunk_rows(n_rows: int, n_classes: int, element_size: int, budget: int) -> int:
    """Tokens per chunk: as many as ``budget`` bytes of logits hold, a multiple of
    ``ROW_MULTIPLE`` above it, at least one, at most ``n_rows`` (pure: sized from the memory
    budget alone, never from the hidden size)."""
    rows = max(1, budget // max(n_classes * element_size, 1))
    if rows > ROW_MULTIPLE:
        rows -= rows % ROW_MULTIPLE
    return max(1, min(rows, n_rows))


def _free_bytes(device: torch.device) -> Optional[int]:
    """Free device memory (the driver's and the caching allocator's unused blocks), or None where
    unknown (a CPU, a device without the query, a CUDA graph being captured)."""
    if device.type == "cuda":
        if torch.cuda.is_current_stream_capturing():
            return None
        free, _ = torch.cuda.mem_get_info(device)
        return free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
    module = getattr(torch, device.type, None)
    query = getattr(module, "mem_get_info", None)
    return query(device)[0] if query is not None else None


def budget(device: torch.device, chunk_bytes: Optional[int]) -> int:
    """The bytes of logits a chunk may hold: ``chunk_bytes``, or the default (module constants),
    free memory read once per call."""
    if chunk_bytes is not None:
        return chunk_bytes
    free = _free_bytes(device)
    if free is None:
        return _last_budget.get(device, CHUNK_LIMIT_BYTES)
    found = _last_budget[device] = min(CHUNK_LIMIT_BYTES, free // FREE_MEMORY_SHARE)
    return found


@functools.lru_cache(maxsize=None)
def _adds_wide(device: torch.device, dtype: torch.dtype, accumulate_dtype: torch.dtype) -> bool:
    """Whether ``torch.addmm(acc, a, b, out_dtype=acc.dtype, out=acc)`` takes ``dtype`` factors
    into an ``accumulate_dtype`` sum on ``device`` (CUDA builds of torch 2.8 and later: the
    product is added in float32 inside the matmul, no temporary). Asked once, with a tiny call."""
    acc = torch.zeros(2, 2, dtype=accumulate_dtype, device=device)
    factor = torch.ones(2, 2, dtype=dtype, device=device)
    try:
        torch.addmm(acc, factor, factor, out_dtype=accumulate_dtype, out=acc)
    except (RuntimeError, NotImplementedError, TypeError):
        return False
    return True


def _add_product(acc: torch.Tensor, a: torch.Tensor, b: torch.Tensor, first: bool, budget_bytes: int) -> None:
    """``acc (+)= a @ b`` (``=`` for the first chunk: beta 0 never reads the uninitialised
    ``acc``), the sum in ``acc``'s dtype."""
    beta = 0 if first else 1
    if acc.dtype == a.dtype:
        acc.addmm_(a, b, beta=beta)
    elif _adds_wide(acc.device, a.dtype, acc.dtype):
        torch.addmm(acc, a, b, beta=beta, out_dtype=acc.dtype, out=acc)
    else:
        # The product in the factors' dtype, added to the wide sum in blocks of rows that keep
        # the temporary within the chunk's budget.
        rows = max(1, budget_bytes // max(b.shape[1] * a.element_size(), 1))
        for start in range(0, acc.shape[0], rows):
            part = torch.mm(a[start:start + rows], b)
            target = acc[start:start + rows]
            target.copy_(part) if first else target.add_(part)


def _chunks(hidden: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor], budget_bytes: int):
    """(start, hidden rows, their logits) per chunk of ``budget_bytes`` of logits."""
    return chunks(hidden, weight, bias, chunk_rows(hidden.shape[0], weight.shape[0], hidden.element_size(),
                                                   budget_bytes))


def chunks(hidden: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor], step: int):
    """(start, hidden rows, their logits) per chunk of ``step`` tokens; the logits in one buffer
    kept for the call."""
    n_rows, n_classes = hidden.shape[0], weight.shape[0]
    logits = hidden.new_empty(min(step, n_rows), n_classes)
    for start in range(0, n_rows, step):
        rows = hidden[start:start + step]
        z = logits[:rows.shape[0]]
        if bias is None:
            torch.mm(rows, weight.t(), out=z)
        else:
            torch.addmm(bias, rows, weight.t(), out=z)
        yield start, rows, z


def _new_gradients(hidden: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor],
                   call: HeadCall, single: bool = False) -> Gradients:
    """The gradients' buffers: weight's and bias's in ``call.accumulate_dtype``, or, for a
    ``single`` chunk, in the weight's own dtype: one matmul over every token then forms the
    weight's gradient, summed in float32 inside the BLAS and rounded once, as a float32 sum over
    one chunk would be, without the float32 copy of the weight (2 GB for Llama 3's head) or the
    pass that rounds it."""
    # Uninitialised: the first chunk's products overwrite them; without tokens they are zeros.
    new = torch.empty if hidden.shape[0] else torch.zeros
    wide = weight.dtype if single else call.accumulate_dtype
    return Gradients(new(hidden.shape, dtype=hidden.dtype, device=hidden.device) if call.grad_hidden else None,
                     new(weight.shape, dtype=wide, device=weight.device) if call.grad_weight else None,
                     new(weight.shape[0], dtype=wide, device=weight.device)
                     if call.grad_bias and bias is not None else None)


def _add_chunk(grads: Gradients, grad_logits: torch.Tensor, rows: torch.Tensor, weight: torch.Tensor, start: int,
               first: bool, budget_bytes: int) -> None:
    """The three products of a chunk's logit gradient: its rows of hidden's gradient, its terms of
    weight's and bias's."""
    if grads.hidden is not None:
        torch.mm(grad_logits, weight, out=grads.hidden[start:start + rows.shape[0]])
    if grads.weight is not None:
        _add_product(grads.weight, grad_logits.t(), rows, first, budget_bytes)
    if grads.bias is not None:
        summed = grad_logits.sum(0, dtype=grads.bias.dtype)
        grads.bias.copy_(summed) if first else grads.bias.add_(summed)


def _single(hidden: torch.Tensor, weight: torch.Tensor, budget_bytes: int) -> bool:
    """Whether every token fits one chunk of ``budget_bytes``."""
    return chunk_rows(hidden.shape[0], weight.shape[0], hidden.element_size(), budget_bytes) >= hidden.shape[0]


def forward(hidden: torch.Tensor, weight: torch.Tensor, target: torch.Tensor, bias: Optional[torch.Tensor],
            class_weight: Optional[torch.Tensor], call: HeadCall, narrow: bool = False
            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, Optional[Gradients]]:
    """The loss (``call.loss_dtype``), lse per token, the stats and, where the forward forms them
    (``HeadCall.grad_in_forward``), the gradients for an incoming gradient of 1. ``narrow``: where
    the tokens fit one chunk, the weight's and bias's gradients come in the weight's dtype
    (``_new_gradients``; the eager path, whose gradients' dtypes may follow the call).

    ``hidden`` (N, H), ``weight`` (V, H), ``target`` (N,), validated (``head``)."""
    options = call.options
    if hidden.device.type == "cpu":
        loss_rows._check_targets(target, options)
    stats = loss_reduction.stats(hidden, target, class_weight, options)
    rows = torch.empty(hidden.shape[0], dtype=loss_arguments._acc(hidden.dtype), device=hidden.device)
    lse = torch.empty_like(rows)
    budget_bytes = budget(hidden.device, call.chunk_bytes)
    single = narrow and _single(hidden, weight, budget_bytes)
    grads = _new_gradients(hidden, weight, bias, call, single) if call.grad_in_forward else None
    for start, chunk, z in _chunks(hidden, weight, bias, budget_bytes):
        stop = start + chunk.shape[0]
        write = grads is not None
        if not loss_rows.launch_forward(z, target[start:stop], class_weight, stats, rows[start:stop],
                                        lse[start:stop], z if write else None, options):
            raise RuntimeError("portable_softmax.linear_cross_entropy: a chunk's logits are not walkable rows")
        if write:
            _add_chunk(grads, z, chunk, weight, start, start == 0, budget_bytes)
    return loss_reduction.reduced(rows, call.loss_dtype, options), lse, stats, grads


def backward(hidden: torch.Tensor, weight: torch.Tensor, target: torch.Tensor, bias: Optional[torch.Tensor],
             class_weight: Optional[torch.Tensor], stats: torch.Tensor, lse: torch.Tensor, dloss: torch.Tensor,
             call: HeadCall, narrow: bool = False) -> Gradients:
    """The gradients of reduction='none' recomputed chunk by chunk from the saved lse, times
    ``dloss`` (N,): each chunk's logits again, their gradient by the loss backward kernel (written
    over them), then the products of ``forward`` (``narrow`` as there)."""
    options = call.options
    budget_bytes = budget(hidden.device, call.chunk_bytes)
    grads = _new_gradients(hidden, weight, bias, call, narrow and _single(hidden, weight, budget_bytes))
    incoming = dloss.reshape(-1)
    for start, chunk, z in _chunks(hidden, weight, bias, budget_bytes):
        stop = start + chunk.shape[0]
        grad_logits = loss_rows.backward(z, target[start:stop], class_weight, stats, lse[start:stop],
                                         incoming[start:stop], options, True)
        _add_chunk(grads, grad_logits, chunk, weight, start, start == 0, budget_bytes)
    return grads


def finish(grad: Optional[torch.Tensor], dloss: Optional[torch.Tensor], dtype: torch.dtype) -> Optional[torch.Tensor]:
    """A gradient formed in the forward as the gradient to return: times ``dloss`` (in place where
    it keeps its dtype, nothing done when dloss is 1, decided on the device) and in ``dtype`` (the
    product and the rounding in one pass). ``dloss`` None: already applied (the recomputed
    gradients of 'none')."""
    if grad is None:
        return None
    if grad.dtype == dtype:
        return grad if dloss is None else loss_rows.rescale(grad, dloss)
    if dloss is None:
        return grad.to(dtype)
    return torch.mul(grad, dloss.reshape(()), out=torch.empty(grad.shape, dtype=dtype, device=grad.device))
