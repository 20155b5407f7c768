"""The softmax and log-softmax kernels: the one Triton source that every backend runs.

Every kernel sees its tensors through the same row view: a row is one softmax vector of ``n_cols``
elements ``col_stride`` apart; rows come in ``n_outer`` groups of ``rows_per_outer``, the group at
``outer_stride`` and the row inside it at ``row_stride``. A softmax over the last dimension is one
group (``outer_stride`` unused); a softmax over a middle dimension of a contiguous tensor is
``n_outer`` groups whose rows are adjacent (``row_stride == 1``), which keeps tiles coalesced
without a transposing copy. A *tile* is ``BLOCK_M`` adjacent rows of one group.

Four regimes, chosen by the launch planner (``planner.py``); ``variants.py`` declares every
kernel's arguments and constexprs. One module per family:

* ``rows``: ``*_tile``, each program keeps a whole tile in registers: one read, one write. A
  program takes one tile (``PER_TILE``) or loops over tiles. Used whenever a row fits a program.
  Rows may be read twice instead (``REREAD``): the second read finds them in L2. ``DENSE``: one
  group of rows, each as wide as the block, with int32 offsets: no group division and no masks
  (torch.compile's form); ``DENSE`` 2, the flat form: one group with int32 offsets, masked (rows
  shorter than the block). And ``*_loop``: a row is streamed in chunks twice (online max/sum, then
  normalise): 1.5x the traffic of the others, but no program ever waits on another, so it is the
  path for backends that cannot promise residency (the CPU interpreter, Ascend, unknown plugins).
* ``split``: ``*_split``, a row cut into chunks held by co-resident programs that trade partials
  through ``exchange`` and read rows off 16-byte boundaries through aligned ``windows``.
* ``partials``: ``*_partials`` and ``*_normalize``, rows cut into parts in two launches (rows
  sharded across ranks, and the ``sliced`` regime).
* ``loss``: ``cross_entropy_*``, the cross-entropy loss and its gradient over the same row view
  (tiles of whole rows, or rows streamed), for ``portable_softmax.cross_entropy``; and
  ``loss_split``, its forward over rows cut into chunks held by co-resident programs (the split
  regime's items, windows and exchange; ``grid_count``: the count of a 'mean''s targets formed by
  its own grid; ``grid_sum``: the reduced loss summed by it); both form their rows' loss, lse and
  gradient with ``loss_terms``.

Shared pieces: ``common`` (rows of a tile, loads and stores, the forward and backward formulas),
``fused`` (the fused scale, masks and causal terms), ``jit`` (which decorator this copy uses).
"""
from .loss import (cross_entropy_backward, cross_entropy_forward_loop, cross_entropy_forward_tile,
                   cross_entropy_grad_scale, cross_entropy_stats, cross_entropy_sum)
from .loss_split import cross_entropy_forward_split
from .partials import (softmax_backward_normalize, softmax_backward_partials, softmax_forward_normalize,
                       softmax_forward_partials)
from .rows import softmax_backward_loop, softmax_backward_tile, softmax_forward_loop, softmax_forward_tile
from .split import softmax_backward_split, softmax_forward_split

__all__ = [
    "cross_entropy_backward", "cross_entropy_forward_loop", "cross_entropy_forward_split", "cross_entropy_forward_tile",
    "cross_entropy_grad_scale", "cross_entropy_stats", "cross_entropy_sum",
    "softmax_backward_loop", "softmax_backward_normalize", "softmax_backward_partials", "softmax_backward_split",
    "softmax_backward_tile", "softmax_forward_loop", "softmax_forward_normalize", "softmax_forward_partials",
    "softmax_forward_split", "softmax_forward_tile",
]
