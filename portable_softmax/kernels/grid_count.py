"""The count of a 'mean''s counted targets, formed by the split forward's own grid (``COUNTED``),
where a kernel before it took a launch of its own (``cross_entropy_stats``: 4.2 us and a launch's
gap on the H200, beside a ~285 us forward of the short rows; NOTES v43).

Each program that takes items counts the targets of one slice of the positions and adds, in one
atomic add to one int32 word, its arrival (above the low ``COUNT_BITS``) and its count (below)
(``_arrive``); each reads the word once, before its first store of anything the count scales,
waiting until every such program has arrived (``_total``): the count is then whole, with no
other memory to order (each add is one read-modify-write of the word, so a relaxed read will
do). Each then counts its departure, and the last to leave resets the word and the departures
for the next launch (the kernel boundary orders the reset before the next launch's adds). One
word of 32 bits holds fewer than 2**12 arrivals and a count below 2**19: the planner asks for the
count where both fit (``variants.grid_count_fits``).

The wait needs every program of the grid resident at once: a persistent grid launched
cooperatively (the driver refuses one that is not). Where programs run one after another (the
interpreter: ``EXCHANGE_PUBLISH`` then ``EXCHANGE_READ``), the first launch arrives and the second
reads, with no wait. A ticketed grid (a program per item, not all resident) cannot wait on the
last of them: its 'mean' keeps the stats kernel (``variants.loss_counts``).

Where: two int32 counters after the tiles' (the first two of ``variants.GRID_COUNTERS``; the third
is the grid sum's, ``grid_sum.py``). An integer count is the same in any order of the adds. (A
weighted 'mean''s denominator is a float sum, whose rounding its order would change: it keeps the
stats kernel, which sums in one fixed order.)

When. Each program arrives before its item loop: Triton's pipeliner moved an arrival made in the
loop body for the first item into another stage than the read, and a grid hung on an H200. A
pipelined program reads the count before its loop too (a read called from the pipelined body,
the only way to keep a wait loop there, added moves around its call site to every item: 1085
instructions an item against 1063 at the launch's register cap); an unpipelined one after its
first item's loads and exchange. Each departs as it reads: with the departure after the loop
(the counters' addresses live across it) and every thread polling, 4096x256000 bf16 ran 30 us
slower on the H200; departing at the read with one thread polling, level (NOTES v43).
"""
from .jit import _jit, _language, tl  # noqa: F401 (_language: see jit.py)
from .exchange import PEER_GROUP
from .loss import _counted_targets

# The word: arrivals above the low ``COUNT_BITS``, the count below (``variants.GRID_COUNT_BITS``).
ARRIVAL = tl.constexpr(1 << 19)


@_jit
def _grid_counters(done_ptr, n_rows):
    """The word's and the departures' counters (int32), after ``n_rows`` tiles'."""
    return done_ptr + n_rows, done_ptr + n_rows + 1


@_jit
def _participants(n_items):
    """The programs that take items, and so arrive: a grid wider than its items has some that do not."""
    return tl.minimum(tl.num_programs(0), n_items)


def _arrive(target_ptr, word, n_items, n_rows, rows_per_outer, target_outer_stride, target_row_stride,
            ignore_index):
    """Count the targets of this program's slice of the ``n_rows`` positions (a row view of
    ``rows_per_outer`` rows a group) that are not ``ignore_index``, and add them with this
    program's arrival at ``word``, if it takes items. The slice is walked a group at a time: the block's indices are
    never divided (triton-ascend's address analysis takes no divided block)."""
    takes = tl.program_id(0) < n_items
    per_program = tl.cdiv(n_rows, _participants(n_items))
    start = tl.program_id(0) * per_program
    stop = tl.minimum(start + per_program, n_rows)
    lanes = tl.arange(0, PEER_GROUP)
    counted_here = tl.zeros([PEER_GROUP], tl.int32)
    for group in tl.range(start // rows_per_outer, (tl.maximum(stop, start + 1) - 1) // rows_per_outer + 1):
        base = group * rows_per_outer
        low = tl.maximum(start, base) - base
        high = tl.minimum(stop, base + rows_per_outer) - base
        for row in tl.range(low, high, PEER_GROUP):
            rows = row + lanes
            where = tl.cast(group, tl.int64) * target_outer_stride + rows.to(tl.int64) * target_row_stride
            _, counted = _counted_targets(target_ptr, where, rows < high, ignore_index)
            counted_here += counted.to(tl.int32)
    tl.atomic_add(word, tl.sum(counted_here, 0) + ARRIVAL, mask=takes, sem="relaxed")


def _total(word, departures, n_items, WAIT: tl.constexpr):
    """The grid's count of counted targets, read from ``word`` once every program that takes
    items has arrived (``WAIT``; without it, a launch before this one arrived); then this
    program's departure (released: its read is done first), the last to leave resetting the word
    and the departures. A program that takes no item (a grid wider than its items: a hand-sized
    one) neither waits nor departs: its count is never used, and its departure would reset the
    word before a later reader's read. Each read is one thread's relaxed atomic for the program (a
    volatile load by every thread would poll the word 128 times as often)."""
    takes = tl.program_id(0) < n_items
    participants = _participants(n_items)
    packed = tl.atomic_add(word, 0, sem="relaxed")
    if WAIT:
        while takes & (packed // ARRIVAL < participants):
            packed = tl.atomic_add(word, 0, sem="relaxed")
    last = takes & (tl.atomic_add(departures, 1, mask=takes, sem="acq_rel") == participants - 1)
    tl.store(word, 0, mask=last)
    tl.store(departures, 0, mask=last)
    return packed % ARRIVAL


_arrived = _jit(_arrive)
_counted_total = _jit(_total)
