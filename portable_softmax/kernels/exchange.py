"""The split regime's exchange: each (row, chunk) publishes its packed (max, sum) partials to a
64-bit slot, waits until its row's slots are full, and reads the row's maximum and total from them
(tiles of several rows count arrivals at a counter instead); then the slots are emptied for the
next launch.

Where programs cannot wait on each other (Triton's interpreter runs them one after another) the
same helpers run the exchange in two launches of the same kernel instead, chosen by their
``PHASE`` constexpr (``EXCHANGE_*``; ``variants`` declares the same numbers): the first
publishes every chunk's partials, the second reads every slot of its rows, all written by the
first, with no wait, and leaves them full (nothing waits on an empty one). ``PHASE`` is the last
parameter of ``_exchange``, ``_empty_previous`` and ``_empty_last``, ``EXCHANGE_WAIT`` (the one
launch with the wait) by default, so that a kernel written for that form calls them unchanged.

A kernel that holds nothing across the exchange (the loss's forward without the gradient) needs
no chunk to learn its row's total, only one: ``_arrive`` (``EXCHANGE_ARRIVE``) publishes, counts
the chunk's arrival and lets the row's last chunk to arrive read every slot, in one launch in
which no program waits, on any backend."""
from .jit import _jit, _jit_call, _language, tl  # noqa: F401 (_language: see jit.py)
from .common import LOG2E, _tile_rows

# An empty scratch slot. Packed partials can never equal it: NaN halves are canonicalised first.
EMPTY_SLOT = tl.constexpr(-1)
# The narrowest warp of any target: a reduction over this many exchange slots stays in one warp.
PEER_GROUP = tl.constexpr(32)
CANONICAL_NAN_BITS = tl.constexpr(0x7FC00000)



# The exchange's PHASE: one launch whose programs publish, wait for their row's peers and read
# (a resident grid: GPUs); or two launches, where programs cannot wait on each other: every chunk
# publishes (1), then every chunk reads its rows' slots, all full by then (2); or one launch in
# which every chunk publishes and counts its arrival, and only the row's last reads (3: ``_arrive``).
EXCHANGE_WAIT = tl.constexpr(0)
EXCHANGE_PUBLISH = tl.constexpr(1)
EXCHANGE_READ = tl.constexpr(2)
EXCHANGE_ARRIVE = tl.constexpr(3)

# ``MAXIMA`` for the loss (True: the softmax's): a row whose maximum is +inf takes its chunks' sums
# against 0, as each of its chunks took its own (``common._lse_reference``): its total +inf (NaN
# with a NaN), its lse +inf as torch's, not exp(inf - inf) = NaN. (The softmax's chunk of +inf
# summed NaN against itself: its row's total is NaN either way, and its kernel keeps no select.)
MAXIMA_LSE = tl.constexpr(2)



@_jit
def _exchange(slot_ptr, done_ptr, tile, chunk, row_mask, packed, BLOCK_M: tl.constexpr, CHUNKS: tl.constexpr,
              CHUNKS_P2: tl.constexpr, MAXIMA: tl.constexpr, STAGES: tl.constexpr, WAIT_ATOMIC: tl.constexpr,
              PHASE: tl.constexpr = EXCHANGE_WAIT):
    """Publish this chunk's partials of the item's rows (``packed``: a [BLOCK_M] int64 block of
    ``_float_bits``, with ``MAXIMA`` the chunk maximum's over its sum's), wait for every chunk of
    the rows, and return the rows' maxima and totals from them all (``_gather_row``; for a tile
    of several rows ``_gather_tile``, [BLOCK_M] each, where one row gives scalars; its counters
    follow the ticket counter at ``done_ptr``).

    ``PHASE`` (default ``EXCHANGE_WAIT``: all of the above, in one launch): ``EXCHANGE_PUBLISH``
    only publishes, and returns zeros (nothing is read: the caller writes nothing either);
    ``EXCHANGE_READ``, in the launch after, publishes nothing (``packed`` is not read) and
    reads the rows' maxima and totals from the slots that launch filled, with no wait.

    Each (row, chunk) owns one 64-bit slot written with a relaxed exchange and read back with a
    relaxed atomic (``_read_slots``): the slot is the only datum exchanged, and a reader needs
    nothing written before it, so no acquire or release (whose fence would drain this program's
    output stores) is needed. (Ticketed rows counting arrivals as tiles do, which would spare
    the fill of their slots before each launch, ran long fp32 rows at 0.80 of copy against 0.90
    on the H200: NOTES v19.)
    """
    tl.static_assert(PHASE != EXCHANGE_ARRIVE, "the arrival form tells its caller which chunk is last: _arrive")
    slots = _row_slots(slot_ptr, tile, BLOCK_M, CHUNKS_P2)
    if PHASE != EXCHANGE_READ:
        if BLOCK_M > 1:
            tl.store(slots + chunk, packed, mask=row_mask)
        else:
            tl.atomic_xchg(slots + chunk, packed, mask=row_mask, sem="relaxed")
    wait: tl.constexpr = PHASE == EXCHANGE_WAIT
    # Triton does not software-pipeline a loop that holds another loop, but one that calls a
    # function holding it. The call costs registers (the calling convention), so only pipelined
    # kernels make it; its arguments are scalars, so it takes chunks of one row.
    # Unpacked before returning: Triton 3.2 loses a returned tuple that was held in one name
    # (the caller's unpacking then fails: "row_total is not defined").
    if PHASE == EXCHANGE_PUBLISH:
        row_max, total = 0.0, 0.0
    elif BLOCK_M > 1:
        tl.static_assert(STAGES == 1, "split tiles of several rows are not pipelined")
        row_max, total = _gather_tile(slots, done_ptr + 1 + 2 * tile, row_mask, CHUNKS, CHUNKS_P2, MAXIMA, wait)
    elif STAGES > 1:
        row_max, total = _gathered_row_called(_first_slot(slot_ptr, tile, CHUNKS_P2), tl.sum(row_mask.to(tl.int32), 0) > 0,
                                              CHUNKS, CHUNKS_P2, MAXIMA, PEER_GROUP, WAIT_ATOMIC, wait)
    else:
        row_max, total = _gathered_row(_first_slot(slot_ptr, tile, CHUNKS_P2), tl.sum(row_mask.to(tl.int32), 0) > 0,
                                       CHUNKS, CHUNKS_P2, MAXIMA, CHUNKS_P2, WAIT_ATOMIC, wait)
    return row_max, total


@_jit
def _arrive(slot_ptr, done_ptr, tile, chunk, row_mask, packed, CHUNKS: tl.constexpr, CHUNKS_P2: tl.constexpr):
    """Publish this chunk's packed (maximum, sum) partials of its one row (``packed``, [1]; as
    ``_exchange`` packs them) and count its arrival at the row's counter (``done_ptr + tile``);
    return whether this chunk is the row's last to arrive and, for that one, the row's maximum
    and total from every chunk's slot (for the others: values to ignore). No program waits:
    a grid of any size runs, resident or not, in one launch, in any order (the interpreter's
    one after another too).

    Memory order. Each chunk stores its slot, then a barrier makes every thread's stores the
    program's (performed, for the thread that counts, before its next access), and one thread
    adds 1 to the counter with ``acq_rel``, at the device's scope: its release publishes the
    slot. The counter's adds are read-modify-writes of one word, so they form one chain in
    which each reads the one before: the release sequence of every earlier add runs through
    every later add up to the last one, whose acquire therefore synchronises with the release
    of every chunk that counted before it. The chunk that reads CHUNKS - 1 is the last, and
    every slot of its row was stored before its reads, which the barrier after its add orders
    behind that acquire for all its threads. The slots are read with ``.cg`` loads (from L2,
    where the peers' stores are): never a line this unit's L1 kept from an earlier launch.
    (Every add is ``acq_rel``: no chunk knows beforehand whether it will be the last.)

    The last resets the counter to 0 for the next launch: every add of this launch is done by
    then, and the kernel boundary orders the reset before the next launch's adds. Slots stay
    full: the next launch's last reads only slots that its own peers stored before counting. So
    its scratch is not the waiting form's, whose slots must be empty between launches."""
    counter = done_ptr + tile
    first_slot = _first_slot(slot_ptr, tile, CHUNKS_P2)
    tl.atomic_xchg(_row_slots(slot_ptr, tile, 1, CHUNKS_P2) + chunk, packed, mask=row_mask, sem="relaxed")
    # One thread counts for the program: the barrier first makes every thread's stores its own.
    tl.debug_barrier()
    last = tl.atomic_add(counter, 1, sem="acq_rel") == CHUNKS - 1
    tl.debug_barrier()
    exists = tl.sum(row_mask.to(tl.int32), 0) > 0
    peers = tl.arange(0, CHUNKS_P2)
    present = (peers < CHUNKS) & exists & last
    v = tl.load(first_slot + peers, mask=present, other=EMPTY_SLOT, cache_modifier=".cg")
    peer_max, peer_sum = _peer_values(v)
    row_max = tl.max(peer_max, 0)
    total = _peer_total(peer_max, peer_sum, row_max, MAXIMA_LSE)
    tl.store(counter, 0, mask=last)
    return last, row_max, total


@_jit
def _row_slots(slot_ptr, tile, BLOCK_M: tl.constexpr, CHUNKS_P2: tl.constexpr):
    """The first exchange slot of each row of ``tile`` ([BLOCK_M]; ``_first_slot``)."""
    return _first_slot(slot_ptr, tile * BLOCK_M + tl.arange(0, BLOCK_M), CHUNKS_P2)


@_jit
def _first_slot(slot_ptr, row, CHUNKS_P2: tl.constexpr):
    """The first exchange slot of ``row`` (a row, or a block of rows). Rows lie CHUNKS_P2 slots
    apart (``launch.LaunchRecord`` sizes the scratch so): a row of up to 16 slots lies in one
    128-byte line, and a longer row starts one. A row of 19 chunks packed 19 apart shared its
    first and last lines with the rows beside it, which other programs publish to and poll while
    it waits: bf16 4096x151936, forward + backward, 0.72 ms against 0.68 padded on the H200
    (NOTES v47)."""
    return slot_ptr + row * CHUNKS_P2


def _gather_row(first_slot, exists, CHUNKS: tl.constexpr, CHUNKS_P2: tl.constexpr, MAXIMA: tl.constexpr,
                GROUP: tl.constexpr, ATOMIC: tl.constexpr, WAIT: tl.constexpr):
    """Wait until the CHUNKS slots from ``first_slot`` are full (``WAIT``; else a launch before
    filled them); the row's maximum (with ``MAXIMA``, else 0) and total (``_peer_total``). Read
    ``GROUP`` slots at a time: called (not inlined), a function's shared memory overlaps the
    caller's pipeline buffers (Triton 3.6 passes it none of its own; rows of 38 and 64 chunks came
    out NaN on the H200), and a reduction over at most ``PEER_GROUP`` slots stays within a warp,
    needing none. Groups start below CHUNKS: one wholly past the row's chunks would wait on
    nothing (a dead loop in the machine code)."""
    if GROUP >= CHUNKS_P2:
        peer_max, peer_sum = _peer_values(_awaited_slots(first_slot, exists, 0, CHUNKS, CHUNKS_P2, ATOMIC, WAIT))
        row_max = tl.max(peer_max, 0) if MAXIMA else 0.0
        total = _peer_total(peer_max, peer_sum, row_max, MAXIMA)
    else:
        row_max = -float("inf") if MAXIMA else 0.0
        if MAXIMA:
            for start in tl.static_range(0, CHUNKS, GROUP):
                peer_max, _ = _peer_values(_awaited_slots(first_slot, exists, start, CHUNKS, GROUP, ATOMIC, WAIT))
                row_max = tl.maximum(row_max, tl.max(peer_max, 0))
        total = 0.0
        for start in tl.static_range(0, CHUNKS, GROUP):
            # In the forward the slots are full by now: one read each.
            peer_max, peer_sum = _peer_values(_awaited_slots(first_slot, exists, start, CHUNKS, GROUP, ATOMIC, WAIT))
            total += _peer_total(peer_max, peer_sum, row_max, MAXIMA)
    return row_max, total


_gathered_row = _jit(_gather_row)


_gathered_row_called = _jit_call(_gather_row)


@_jit
def _awaited_slots(first_slot, exists, start, CHUNKS: tl.constexpr, GROUP: tl.constexpr, ATOMIC: tl.constexpr,
                   WAIT: tl.constexpr = True):
    """Slots [start, start + GROUP) of a row, once those of its CHUNKS chunks are all full
    (``EMPTY_SLOT`` past them); read once without ``WAIT`` (a launch before filled them)."""
    peers = start + tl.arange(0, GROUP)
    present = (peers < CHUNKS) & exists
    v = _read_slots(first_slot + peers, present, ATOMIC)
    if WAIT:
        while tl.sum((v == EMPTY_SLOT).to(tl.int32)) > 0:
            v = _read_slots(first_slot + peers, present, ATOMIC)
    return tl.where(present, v, EMPTY_SLOT)


@_jit
def _read_slots(slots, present, ATOMIC: tl.constexpr):
    """The current values of exchange ``slots`` (0 where not ``present``), read so that every
    trip of a wait loop reads memory again. A relaxed atomic that adds 0 (``ATOMIC``) stays in
    the loop on every target: Triton 3.6+ turns AMD's volatile loads into buffer loads without
    the volatile bit, which LLVM hoists out of the loop (a program then spins forever on the
    empty slot it read first), and 3.3-3.5 keep them in the loop but without cache bits, so
    they may hit a stale L1. The volatile load is NVIDIA's ``ld.volatile``, kept by ptxas."""
    if ATOMIC:
        v = tl.atomic_add(slots, 0, mask=present, sem="relaxed")
        # A masked lane's result is undefined: it must not look empty.
        v = tl.where(present, v, 0)
    else:
        v = tl.load(slots, mask=present, other=0, volatile=True)
    return v


@_jit
def _peer_values(v):
    """The maxima (high halves; -inf where ``EMPTY_SLOT``) and sums (low halves; 0 there) of a
    row's packed partials ``v``."""
    present = v != EMPTY_SLOT
    return tl.where(present, _bits_float(v >> 32), -float("inf")), tl.where(present, _bits_float(v), 0.0)


@_jit
def _peer_total(peer_max, peer_sum, row_max, MAXIMA: tl.constexpr):
    """What partials contribute to their row's total. With ``MAXIMA`` (the forward) a partial
    is a chunk's maximum and its sum of exp(x - that maximum) (0 for a chunk of -inf only),
    rescaled here to the row's maximum (``MAXIMA_LSE``: to 0 where that is +inf); without, a
    partial is a sum."""
    if MAXIMA:
        ref = row_max
        if MAXIMA == MAXIMA_LSE:
            # One select a row: a chunk of +inf (its sum +inf against 0) times exp(inf), others
            # times exp(their maximum): the total +inf, or NaN with a NaN.
            ref = tl.where(row_max == float("inf"), 0.0, row_max)
        # A row of -inf only gives -inf - -inf = NaN here, and NaN outputs, as torch does.
        peer_sum = peer_sum * tl.exp2((peer_max - ref) * LOG2E)
    return tl.sum(peer_sum, 0)


@_jit
def _gather_tile(slots, counters, row_mask, CHUNKS: tl.constexpr, CHUNKS_P2: tl.constexpr, MAXIMA: tl.constexpr,
                 WAIT: tl.constexpr = True):
    """``_gather_row`` for a tile of rows (``slots``: each row's first slot, [BLOCK_M]; this
    program's chunk has stored its partials there): the rows' maxima and totals ([BLOCK_M] each).

    A tile's rows lie side by side in memory (a reduction along a strided dimension), and a wait
    that re-read all their slots ([BLOCK_M, CHUNKS]) on every trip would flood the cache that
    its peers publish through (a 64-row tile of 256 chunks ran 50 times slower than a copy).
    So the tile's chunks count their arrivals at ``counters`` (arrivals, departures): each adds
    itself with release semantics once its partials are stored, waits for all CHUNKS (one word
    per trip, ``_awaited_count``), then reads the slots once. Slots are never emptied; the last
    chunk to leave resets the counters for the next launch. Without ``WAIT`` a launch before filled
    the slots: they are read, and the counters left alone."""
    if WAIT:
        # One thread counts for the program: the barrier first makes every thread's stores its
        # own, which its release then publishes (the grid-wide barrier's pattern).
        tl.debug_barrier()
        tl.atomic_add(counters, 1, sem="release")
        _awaited_count(counters, CHUNKS)
        tl.debug_barrier()
    peers = tl.arange(0, CHUNKS_P2)
    present = row_mask[:, None] & (peers < CHUNKS)[None, :]
    # From L2, where the peers' stores are: never a line this unit's L1 kept.
    v = tl.load(slots[:, None] + peers[None, :], mask=present, other=EMPTY_SLOT, cache_modifier=".cg")
    peer_max, peer_sum = _peer_values(v)
    row_max = tl.max(peer_max, 1)
    if MAXIMA:
        peer_sum = peer_sum * tl.exp2((peer_max - row_max[:, None]) * LOG2E)
    if WAIT:
        last = tl.atomic_add(counters + 1, 1, sem="relaxed") == CHUNKS - 1
        tl.store(counters, 0, mask=last)
        tl.store(counters + 1, 0, mask=last)
    return row_max, tl.sum(peer_sum, 1)


@_jit
def _awaited_count(counter, COUNT: tl.constexpr):
    """Wait until the int32 ``counter`` reaches ``COUNT``. Each trip is one atomic read with
    acquire semantics, made by one thread for the program: what the programs that counted
    stored before counting is seen after. (A volatile read would be made by every thread, and
    ran a 16-row bf16 column split at 0.37 of copy against 0.49 on the H100.)"""
    seen = tl.atomic_add(counter, 0, sem="acquire")
    while seen < COUNT:
        seen = tl.atomic_add(counter, 0, sem="acquire")


@_jit
def _float_bits(v):
    """The bits of fp32 ``v`` as int64 in [0, 2**32), NaN canonicalised."""
    bits = tl.where(v != v, CANONICAL_NAN_BITS, v.to(tl.int32, bitcast=True))
    return bits.to(tl.uint32).to(tl.int64)


@_jit
def _bits_float(bits):
    """The fp32 held in the low 32 bits of int64 ``bits``."""
    return bits.to(tl.int32).to(tl.float32, bitcast=True)


@_jit
def _empty_previous(slot_ptr, tile, chunk, tiles_per_outer, rows_per_outer, BLOCK_M: tl.constexpr,
                    CHUNKS: tl.constexpr, CHUNKS_P2: tl.constexpr, TICKETED: tl.constexpr,
                    PHASE: tl.constexpr = EXCHANGE_WAIT):
    """Empty this program's slots of the tile it held before ``tile`` (none on its first). Called
    once every chunk of ``tile`` has published: a peer publishes only after it has read all of
    the previous tile's slots, and the peers of every tile are the same programs (the grid is a
    multiple of CHUNKS). A plain store: no program waits on a round trip to clean up. Ticketed
    grids leave their slots full (the launch fills them before the next); tiles of several rows
    count arrivals instead (``_gather_tile``) and leave theirs full, as do both launches of a
    two-launch exchange (``PHASE`` other than ``EXCHANGE_WAIT``): the reading launch's programs
    read slots that others publish, and nothing waits on an empty one."""
    # Parenthesised: Triton 3.2 refuses a chain of three boolean operands.
    if (PHASE == EXCHANGE_WAIT and not TICKETED) and BLOCK_M == 1:
        # Programs step through items a grid apart, CHUNKS items to a tile: a first tile gives < 0.
        previous = tile - tl.num_programs(0) // CHUNKS
        slots, row_mask = _tile_slots(slot_ptr, previous, tiles_per_outer, rows_per_outer, BLOCK_M, CHUNKS_P2)
        tl.store(slots + chunk, tl.full([BLOCK_M], EMPTY_SLOT, tl.int64), mask=row_mask & (previous >= 0))


@_jit
def _empty_last(slot_ptr, done_ptr, n_items, tiles_per_outer, rows_per_outer, BLOCK_M: tl.constexpr,
                CHUNKS: tl.constexpr, CHUNKS_P2: tl.constexpr, TICKETED: tl.constexpr,
                PHASE: tl.constexpr = EXCHANGE_WAIT):
    """Empty the slots of a program's last tile, which no later publication vouches for: the last
    of its chunks to arrive at the tile's counter empties them all and resets the counter, leaving
    the scratch clean for the next launch (kernel boundaries order the resets before any later
    read); nothing for a program that took no item. Nothing for ticketed grids, whose counter is
    their ticket (``_split_items``), nor for tiles of several rows (``_gather_tile``), nor for a
    two-launch exchange (``_empty_previous``)."""
    # Parenthesised: Triton 3.2 refuses a chain of three boolean operands.
    if (PHASE == EXCHANGE_WAIT and not TICKETED) and BLOCK_M == 1:
        first, step = tl.program_id(0), tl.num_programs(0)
        tile = (first + (n_items - 1 - first) // step * step) // CHUNKS
        # A program of a grid wider than its items took none: its "last tile" is -1, whose counter
        # lies before the buffer (an H200 run's loss came out a third short when the buffers
        # beside it moved, NOTES v47).
        took = first < n_items
        last = (tl.atomic_add(done_ptr + tile, 1, mask=took, sem="relaxed") == CHUNKS - 1) & took
        slots, row_mask = _tile_slots(slot_ptr, tile, tiles_per_outer, rows_per_outer, BLOCK_M, CHUNKS_P2)
        peers = tl.arange(0, CHUNKS_P2)
        tl.store(slots[:, None] + peers[None, :], tl.full([BLOCK_M, CHUNKS_P2], EMPTY_SLOT, tl.int64),
                 mask=row_mask[:, None] & (peers < CHUNKS)[None, :] & last)
        tl.store(done_ptr + tile, 0, mask=last)


@_jit
def _tile_slots(slot_ptr, tile, tiles_per_outer, rows_per_outer, BLOCK_M: tl.constexpr, CHUNKS_P2: tl.constexpr):
    """The first slot of each row of ``tile`` ([BLOCK_M]), and which rows exist."""
    _, _, row_mask = _tile_rows(tile, tiles_per_outer, rows_per_outer, BLOCK_M, False)
    return _row_slots(slot_ptr, tile, BLOCK_M, CHUNKS_P2), row_mask
