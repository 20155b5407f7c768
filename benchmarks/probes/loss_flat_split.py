"""Probe (v48): the loss's split rows cut from the logits taken flat, not row by row.

The split regime cuts each row into chunks: a row of 50257 bf16 logits is 13 chunks of 4096 at
2 warps (12 of 8192 would leave its last chunk 13% full), off 16-byte boundaries, so it is read
through windows and unpipelined; forward + backward reads 0.71 of the copy floor on the H200 where
8192x32000 (4 chunks of 8192, 4 warps, pipelined) reads 0.86 (v47). Aligned rows of 50256 read
0.76 (v48 call 1).

Here the (rows x classes) logits are one flat, contiguous vector cut into aligned chunks of
BLOCK: no padding, no windows, every load and store whole but the vector's last chunk's. A chunk
is shorter than a row, so it holds the end of one row and the start of the next at most: it
publishes a (maximum, sum) pair for each row it touches, into the row's slot for that chunk, and
waits for both rows' chunks. Items are taken round-robin by a persistent grid, so a row's chunks
(consecutive items) run at once on consecutive programs; a program waits only on items at most a
row's span of chunks after its own, all taken by programs that finished their earlier items: no
deadlock once the grid is resident and wider than a row's chunks.

Plain options only (class targets, ignore_index, 'mean' from a scale computed before; the loss
per row summed by torch afterwards): what it measures is the kernel's time against the floor,
beside the library's forward + backward in the same run. Not the library's kernel: a measurement.

    python3 benchmarks/probes/loss_flat_split.py [SHAPE,...] [BLOCK:WARPS:PER_SM:STAGES:MAXNREG,...]

(MAXNREG 0: uncapped; PER_SM the most programs an SM, fewer where the binary does not fit.)
    python3 benchmarks/probes/loss_flat_split.py --cpu      # the two-launch form on the interpreter
"""
import math
import os
import sys

if "--cpu" in sys.argv:
    os.environ["TRITON_INTERPRET"] = "1"

import torch
import triton
import triton.language as tl

LOG2E = tl.constexpr(1.4426950408889634)
# PHASE: 0 one launch that waits (GPUs); 1 publish only, 2 read the full slots (the interpreter,
# whose programs run one after another).
WAIT, PUBLISH, READ = 0, 1, 2


@triton.jit
def _publish(slot_ptr, row, j, m, s, SLOTS: tl.constexpr):
    m_bits = m.to(tl.int32, bitcast=True).to(tl.uint32).to(tl.int64)
    s_bits = s.to(tl.int32, bitcast=True).to(tl.uint32).to(tl.int64)
    tl.atomic_xchg(slot_ptr + row * SLOTS + j, (m_bits << 32) | s_bits, sem="relaxed")


@triton.jit
def _row_lse(slot_ptr, row, count, SLOTS: tl.constexpr, PHASE: tl.constexpr):
    """The row's natural lse from its ``count`` slots, waiting until all are full (0: empty; a
    published pair's sum is at least 1, never 0 bits)."""
    idx = tl.arange(0, SLOTS)
    present = idx < count
    ptrs = slot_ptr + row * SLOTS + idx
    v = tl.load(ptrs, mask=present, other=0, volatile=True)
    if PHASE == 0:
        while tl.sum((present & (v == 0)).to(tl.int32), 0) > 0:
            v = tl.load(ptrs, mask=present, other=0, volatile=True)
    m = (v >> 32).to(tl.int32).to(tl.float32, bitcast=True)
    s = v.to(tl.int32).to(tl.float32, bitcast=True)
    m = tl.where(present, m, -float("inf"))
    top = tl.max(m, 0)
    total = tl.sum(tl.where(present, s * tl.exp2((m - top) * LOG2E), 0.0), 0)
    return top + tl.log2(total) / LOG2E


@triton.jit
def _row_loss(x_ptr, loss_ptr, row, target, lse, n_cols, ignore_index):
    x_t = tl.load(x_ptr + row * n_cols + tl.where(target == ignore_index, 0, target)).to(tl.float32)
    tl.store(loss_ptr + row, tl.where(target == ignore_index, 0.0, lse - x_t))


@triton.jit
def _true_class(x_ptr, g_ptr, base, hot, m, c, scale, BLOCK: tl.constexpr):
    """Where the chunk holds a row's true class (``hot`` columns past its start): that column's
    gradient p_t c - scale, stored over what the chunk stored there (p_t c), after a barrier that
    orders the two stores (other threads wrote the vector). A compare a lane instead would keep
    the lanes' columns in registers across the wait."""
    if (hot >= 0) & (hot < BLOCK):
        tl.debug_barrier()
        x_t = tl.load(x_ptr + base + hot).to(tl.float32)
        tl.store(g_ptr + base + hot, (tl.exp2((x_t - m) * LOG2E) * c - scale).to(g_ptr.dtype.element_ty))


@triton.jit
def _side(x_ptr, base, q, split, limit):
    """The 8 columns of vector ``q`` of the chunk at ``base`` (a vector that a row's end or the
    vector's end cuts): their logits (-inf from ``limit`` on: the vector's end, or 0 where the
    vector is not taken apart), and which lie in the chunk's first row (before ``split``)."""
    pos = q * 8 + tl.arange(0, 8)
    ok = pos < limit
    xs = tl.load(x_ptr + base + pos, mask=ok, other=-float("inf")).to(tl.float32)
    return xs, ok, pos < split


@triton.jit
def _side_store(g_ptr, base, q, xs, ok, in_a, m_a, m_b, c_a, c_b):
    pos = q * 8 + tl.arange(0, 8)
    gs = tl.exp2((xs - tl.where(in_a, m_a, m_b)) * LOG2E) * tl.where(in_a, c_a, c_b)
    tl.store(g_ptr + base + pos, gs.to(g_ptr.dtype.element_ty), mask=ok)


@triton.jit
def _item(k, x, x_ptr, t_ptr, g_ptr, loss_ptr, slot_ptr, scale, total, n_cols, ignore_index,
          BLOCK: tl.constexpr, SLOTS: tl.constexpr, PHASE: tl.constexpr, TAIL: tl.constexpr):
    # The chunk as [vectors, 8]: which row a column holds is decided a vector (16 bytes) at a time,
    # a compare of the vector's index; the (at most two) vectors that a row's end or the vector's
    # end cuts are taken apart (``_side``). A compare a column would keep every lane's column in
    # registers (sm_90: 96 -> 209-255 registers at 64 columns a thread).
    V: tl.constexpr = BLOCK // 8
    vec = tl.arange(0, V)[:, None]
    offs = vec * 8 + tl.arange(0, 8)[None, :]
    base = tl.cast(k, tl.int64) * BLOCK
    ra = base // n_cols
    row_end = (ra + 1) * n_cols
    first_a = (ra * n_cols) // BLOCK
    last_a = (row_end - 1) // BLOCK
    t_a = tl.load(t_ptr + ra)
    scale_a = tl.where(t_a == ignore_index, 0.0, scale)
    hot_a = tl.where(t_a == ignore_index, -1, ra * n_cols + t_a - base).to(tl.int32)
    straddles = (row_end < base + BLOCK) & (row_end < total)
    if TAIL or straddles:
        split = tl.where(straddles, row_end - base, BLOCK).to(tl.int32)
        inside = tl.minimum(total - base, BLOCK).to(tl.int32)
        qs = split // 8
        qe = inside // 8
        keep = (vec != qs) & (vec < qe)
        in_a = vec < qs
        xm = tl.where(keep, x, -float("inf"))
        # Vector qs is cut by the row's end, qe by the vector's end (past the chunk where not cut);
        # where both are one vector it is taken once.
        xs, ok_s, a_s = _side(x_ptr, base, qs, split, tl.where(qs < V, inside, 0))
        xe, ok_e, a_e = _side(x_ptr, base, qe, split, tl.where((qe != qs) & (qe < V), inside, 0))
        m_a = tl.maximum(tl.max(tl.max(tl.where(in_a, xm, -float("inf")), 1), 0),
                         tl.maximum(tl.max(tl.where(a_s, xs, -float("inf")), 0),
                                    tl.max(tl.where(a_e, xe, -float("inf")), 0)))
        m_b = tl.maximum(tl.max(tl.max(tl.where(in_a, -float("inf"), xm), 1), 0),
                         tl.maximum(tl.max(tl.where(a_s, -float("inf"), xs), 0),
                                    tl.max(tl.where(a_e, -float("inf"), xe), 0)))
        # Lanes kept out are -inf: their exponentials 0 whichever maximum they take.
        e = tl.exp2((xm - tl.where(in_a, m_a, m_b)) * LOG2E)
        es = tl.exp2((xs - tl.where(a_s, m_a, m_b)) * LOG2E)
        ee = tl.exp2((xe - tl.where(a_e, m_a, m_b)) * LOG2E)
        s_a = (tl.sum(tl.sum(tl.where(in_a, e, 0.0), 1), 0) + tl.sum(tl.where(a_s, es, 0.0), 0)
               + tl.sum(tl.where(a_e, ee, 0.0), 0))
        s_b = (tl.sum(tl.sum(tl.where(in_a, 0.0, e), 1), 0) + tl.sum(tl.where(a_s, 0.0, es), 0)
               + tl.sum(tl.where(a_e, 0.0, ee), 0))
        if PHASE != 2:
            _publish(slot_ptr, ra, k - first_a, m_a, s_a, SLOTS)
            if straddles:
                _publish(slot_ptr, ra + 1, 0, m_b, s_b, SLOTS)
        if PHASE != 1:
            lse_a = _row_lse(slot_ptr, ra, last_a - first_a + 1, SLOTS, PHASE)
            c_a = tl.exp2((m_a - lse_a) * LOG2E) * scale_a
            c_b = c_a
            lse_b = lse_a
            scale_b = scale_a
            hot_b = tl.full([], -1, tl.int32)
            if straddles:
                lse_b = _row_lse(slot_ptr, ra + 1, (row_end + n_cols - 1) // BLOCK - k + 1, SLOTS, PHASE)
                t_b = tl.load(t_ptr + ra + 1)
                scale_b = tl.where(t_b == ignore_index, 0.0, scale)
                c_b = tl.exp2((m_b - lse_b) * LOG2E) * scale_b
                # An ignored target (-100) would name a column of the other row.
                hot_b = tl.where(t_b == ignore_index, -1, row_end + t_b - base).to(tl.int32)
            g = e * tl.where(in_a, c_a, c_b)
            tl.store(g_ptr + base + offs, g.to(g_ptr.dtype.element_ty), mask=keep)
            _side_store(g_ptr, base, qs, xs, ok_s, a_s, m_a, m_b, c_a, c_b)
            _side_store(g_ptr, base, qe, xe, ok_e, a_e, m_a, m_b, c_a, c_b)
            _true_class(x_ptr, g_ptr, base, hot_a, m_a, c_a, scale_a, BLOCK)
            _true_class(x_ptr, g_ptr, base, hot_b, m_b, c_b, scale_b, BLOCK)
            if k == last_a:
                _row_loss(x_ptr, loss_ptr, ra, t_a, lse_a, n_cols, ignore_index)
    else:
        # The common form: a chunk inside one row, its exponentials held across the wait.
        m = tl.max(tl.max(x, 1), 0)
        e = tl.exp2((x - m) * LOG2E)
        if PHASE != 2:
            _publish(slot_ptr, ra, k - first_a, m, tl.sum(tl.sum(e, 1), 0), SLOTS)
        if PHASE != 1:
            lse_a = _row_lse(slot_ptr, ra, last_a - first_a + 1, SLOTS, PHASE)
            c_a = tl.exp2((m - lse_a) * LOG2E) * scale_a
            tl.store(g_ptr + base + offs, (e * c_a).to(g_ptr.dtype.element_ty))
            _true_class(x_ptr, g_ptr, base, hot_a, m, c_a, scale_a, BLOCK)
            if k == last_a:
                _row_loss(x_ptr, loss_ptr, ra, t_a, lse_a, n_cols, ignore_index)


@triton.jit
def flat_cross_entropy(x_ptr, t_ptr, g_ptr, loss_ptr, slot_ptr, scale_ptr, total, n_cols, ignore_index,
                       BLOCK: tl.constexpr, SLOTS: tl.constexpr, PHASE: tl.constexpr, STAGES: tl.constexpr):
    pid = tl.program_id(0)
    step = tl.num_programs(0)
    offs = tl.arange(0, BLOCK // 8)[:, None] * 8 + tl.arange(0, 8)[None, :]
    scale = tl.load(scale_ptr)
    n_full = total // BLOCK
    # Whole chunks, loaded with no mask; STAGES > 1: Triton's pipeliner loads the next items'
    # chunks while this one waits on its rows' peers.
    for k in tl.range(pid, n_full, step, num_stages=STAGES):
        x = tl.load(x_ptr + tl.cast(k, tl.int64) * BLOCK + offs).to(tl.float32)
        _item(k, x, x_ptr, t_ptr, g_ptr, loss_ptr, slot_ptr, scale, total, n_cols, ignore_index, BLOCK, SLOTS, PHASE,
              False)
    # The vector's last, partial chunk, by the program whose turn it is (after its whole ones):
    # its vectors past the end masked a vector at a time (the one the end cuts is a side vector).
    if (n_full * BLOCK < total) & (pid == n_full % step):
        base = tl.cast(n_full, tl.int64) * BLOCK
        inside = (total - base).to(tl.int32)
        x = tl.load(x_ptr + base + offs, mask=tl.arange(0, BLOCK // 8)[:, None] < inside // 8,
                    other=-float("inf")).to(tl.float32)
        _item(n_full, x, x_ptr, t_ptr, g_ptr, loss_ptr, slot_ptr, scale, total, n_cols, ignore_index, BLOCK, SLOTS,
              PHASE, True)


def slots_per_row(n_cols: int, block: int) -> int:
    return triton.next_power_of_2(math.ceil(n_cols / block) + 1)


def flat_loss(x, target, block, warps, programs, stages, phases=(WAIT,), slots=None, scale=None, maxnreg=None):
    """(loss 'mean', gradient of the 'mean') of the plain cross-entropy; ``slots`` zeroed here."""
    n_rows, n_cols = x.shape
    assert x.is_contiguous() and n_cols > block
    width = slots_per_row(n_cols, block)
    if slots is None:
        slots = torch.zeros(n_rows * width, dtype=torch.int64, device=x.device)
    else:
        slots.zero_()
    if scale is None:
        scale = 1.0 / (target != -100).sum().to(torch.float32)
    grad = torch.empty_like(x)
    rows = torch.empty(n_rows, dtype=torch.float32, device=x.device)
    for phase in phases:
        flat_cross_entropy[(programs,)](x, target, grad, rows, slots, scale, x.numel(), n_cols, -100,
                                        BLOCK=block, SLOTS=width, PHASE=phase, STAGES=stages,
                                        num_warps=warps, num_stages=stages, **({"maxnreg": maxnreg} if maxnreg else {}))
    return rows.sum() * scale, grad


def _errors(x, target, loss, grad):
    ref = x.detach().double().requires_grad_()
    ref_loss = torch.nn.functional.cross_entropy(ref, target)
    ref_loss.backward()
    err = lambda a, b: ((a.double() - b).norm() / b.norm()).item()  # noqa: E731
    return err(loss, ref_loss.detach()), err(grad, ref.grad)


def cpu_check() -> None:
    torch.manual_seed(0)
    for n_rows, n_cols, block in [(7, 300, 128), (5, 257, 256), (9, 129, 64), (4, 512, 128), (3, 1000, 256),
                                  (6, 203, 128), (11, 97, 64)]:
        x = torch.randn(n_rows, n_cols) * 4
        target = torch.randint(0, n_cols, (n_rows,))
        target[1] = -100
        # True classes in the vectors a row's end cuts: the first and last columns.
        target[2], target[-1] = 0, n_cols - 1
        for programs in (1, 3, 16):
            loss, grad = flat_loss(x, target, block, 1, programs, 1, phases=(PUBLISH, READ))
            e_loss, e_grad = _errors(x, target, loss, grad)
            print(f"{n_rows}x{n_cols} block {block} programs {programs}: loss err {e_loss:.1e} grad err {e_grad:.1e}")
            assert e_loss < 1e-5 and e_grad < 1e-5


def _resident(kernel, warps: int) -> int:
    """Programs an SM by registers and warps (the H100's and H200's 64K registers, 64 warps)."""
    regs = -(-kernel.n_regs * 32 // 256) * 256
    return min(64 // warps, 65536 // (regs * warps))


def gpu_run(shapes, configs) -> None:
    from triton.testing import do_bench

    import portable_softmax as ps

    sms = torch.cuda.get_device_properties(0).multi_processor_count
    print(f"{torch.cuda.get_device_name(0)}, torch {torch.__version__}, Triton {triton.__version__}, {sms} SMs")
    print(f"{'shape':>12} {'form':>24} {'ms':>7} {'floor':>6} {'loss err':>9} {'grad err':>9}  notes", flush=True)
    for shape in shapes:
        n_rows, n_cols = (int(v) for v in shape.split("x"))
        torch.manual_seed(0)
        x = torch.randn(n_rows, n_cols, device="cuda", dtype=torch.bfloat16) * 3
        target = torch.randint(0, n_cols, (n_rows,), device="cuda")
        target[::7] = -100
        copy = do_bench(lambda: x.clone(), warmup=10, rep=50, return_mode="median")
        for _ in range(2):
            xg = x.detach().requires_grad_()

            def library():
                xg.grad = None
                ps.cross_entropy(xg, target).backward()

            library()
            ms = do_bench(library, warmup=10, rep=100, return_mode="median")
            e_loss, e_grad = _errors(x, target, ps.cross_entropy(xg, target), _library_grad(ps, x, target))
            print(f"{shape:>12} {'library fwd+bwd':>24} {ms:7.3f} {copy / ms:6.2f} {e_loss:9.1e} {e_grad:9.1e}",
                  flush=True)
            for config in configs:
                block, warps, per_sm, stages, maxnreg = (int(v) for v in config.split(":"))
                cap = {"maxnreg": maxnreg} if maxnreg else {}
                width = slots_per_row(n_cols, block)
                slots = torch.zeros(n_rows * width, dtype=torch.int64, device="cuda")
                scale = 1.0 / (target != -100).sum().to(torch.float32)
                compiled = flat_cross_entropy.warmup(x, target, x, x, slots, scale, x.numel(), n_cols, -100,
                                                     BLOCK=block, SLOTS=width, PHASE=WAIT, STAGES=stages,
                                                     num_warps=warps, num_stages=stages, grid=(1,), **cap)
                compiled._init_handles()
                fits = _resident(compiled, warps)
                programs = min(per_sm, fits) * sms
                notes = f"p{programs} ({min(per_sm, fits)}/SM, fits {fits}) regs {compiled.n_regs} spills {compiled.n_spills}"
                if programs < n_cols // block + 2:
                    print(f"{shape:>12} {config:>24} skipped: {notes}", flush=True)
                    continue
                run = lambda: flat_loss(x, target, block, warps, programs, stages, slots=slots,  # noqa: E731
                                        scale=scale, maxnreg=maxnreg)
                loss, grad = run()
                e_loss, e_grad = _errors(x, target, loss, grad)
                ms = do_bench(run, warmup=10, rep=100, return_mode="median")
                print(f"{shape:>12} {'flat ' + config:>24} {ms:7.3f} {copy / ms:6.2f} {e_loss:9.1e} {e_grad:9.1e}  "
                      f"{notes}", flush=True)
        del x, target
        torch.cuda.empty_cache()


def _library_grad(ps, x, target):
    xg = x.detach().requires_grad_()
    ps.cross_entropy(xg, target).backward()
    return xg.grad


if __name__ == "__main__":
    if "--cpu" in sys.argv:
        cpu_check()
    else:
        args = [a for a in sys.argv[1:] if not a.startswith("--")]
        gpu_run(args[0].split(",") if args else ["4096x50257", "8192x32000", "4096x50256"],
                args[1].split(",") if len(args) > 1 else ["8192:4:4:3:128", "8192:4:4:1:128", "8192:4:5:3:96"])
