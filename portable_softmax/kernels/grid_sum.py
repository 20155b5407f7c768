"""A reduced loss summed by the split forward's own grid (``SUMMED``), where a kernel after it took
a launch of its own (``cross_entropy_sum``: 3.3 us on the H200 after a ~285 us forward of the
short rows, and for the long rows' shares, more than its one block, torch's sum and cast; NOTES
v44).

Each program adds its items' shares of the loss in a register as it goes (one value a program,
in the order it takes its items), and once its items are done stores that partial in its own
slot, after the grid's counters. It then counts its finish; the program that counts last (the
others are done) sums every partial, block after block, rounds the sum once into the loss's
dtype at ``out``, and resets the slots and the counter for the next launch. Nothing waits, so a
grid of any size runs; the order of the sum is fixed by the grid, so a layout's loss is the same
every run.

Memory order, as the exchange's arrival (``exchange._arrive``): a barrier makes every thread's
store of the partial the program's, one thread adds 1 with ``acq_rel`` at the device's scope,
so the last add's acquire follows every earlier program's release; a barrier after it orders
the last program's threads behind it, and the partials are read from L2 (``.cg``).

Where: the finish counter and a partial a program after the count's counters
(``variants.GRID_COUNTERS``, ``launch.LaunchRecord``). Where programs run one after another (the
interpreter's two launches), the reading launch sums.
"""
from .jit import _jit, _language, tl  # noqa: F401 (_language: see jit.py)
from .common import _cast
from .grid_count import _participants

# The partials the last program loads at once: a block of the grid, in order (528 on an H200's
# short rows: one block).
SUM_BLOCK = tl.constexpr(1024)


@_jit
def _sum_counters(done_ptr, n_rows):
    """The finish counter and the first partial's slot (int32, a float's bits), after ``n_rows``
    tiles' counters and the count's two (``grid_count._grid_counters``)."""
    return done_ptr + n_rows + 2, done_ptr + n_rows + 3


@_jit
def _finished(partial, finish, partials, out_ptr, n_items):
    """Store this program's ``partial`` (float32) and count its finish; the last to finish of the
    programs that take items writes the sum of every partial to ``out_ptr`` in its dtype and
    leaves the slots and ``finish`` at 0. A program that takes no item (a grid wider than its
    items) neither stores nor counts."""
    takes = tl.program_id(0) < n_items
    participants = _participants(n_items)
    tl.store(partials + tl.program_id(0), partial.to(tl.int32, bitcast=True), mask=takes)
    # One thread counts for the program: the barrier first makes every thread's stores its own.
    tl.debug_barrier()
    last = takes & (tl.atomic_add(finish, 1, mask=takes, sem="acq_rel") == participants - 1)
    tl.debug_barrier()
    if last:
        lanes = tl.arange(0, SUM_BLOCK)
        total = tl.zeros([SUM_BLOCK], tl.float32)
        for start in tl.range(0, participants, SUM_BLOCK):
            present = start + lanes < participants
            bits = tl.load(partials + start + lanes, mask=present, other=0, cache_modifier=".cg")
            total += bits.to(tl.float32, bitcast=True)
            tl.store(partials + start + lanes, tl.zeros([SUM_BLOCK], tl.int32), mask=present)
        tl.store(out_ptr, _cast(tl.sum(total, 0), out_ptr.dtype.element_ty))
        tl.store(finish, 0)
