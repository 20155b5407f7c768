"""Probe (v46): what the split cross-entropy's exchange costs its forward + backward, by row length.

Variants of the kernel package (``kernel_variant.py``; measurement only, the variants' outputs are
wrong), each run through the library's own planner and launcher at the same programs an SM:

* ``base``: the library's kernels.
* ``nowait``: a chunk reads its row's slots once and goes on (``exchange._awaited_slots`` without its
  loop): what waiting on the row's slowest chunk costs, the round trip of the read kept.
* ``noexchange``: no publication and no read; each chunk takes its own maximum and sum as its row's:
  the split grid's loads, reductions and stores alone.
* ``pad`` (v47): each row's slots start on a 128-byte line (a row of 19 chunks otherwise shares its
  first and last lines with the rows beside it, which other groups publish to and poll while it
  waits); ``spreadS``: its slots S apart besides (4: a 32-byte sector each, 16: a line each);
  ``fresh``: a trip of the wait reads only the slots still empty. Correct outputs, the slot
  scratch asked for 32 times as large. (Since v47 the library's rows lie CHUNKS_P2 slots apart, the
  layout ``pad`` measured, and these pad and spread from there. v47's ``nowhole``, every item
  through the masked loop, is now ``Tuning.loss_whole_chunks``'s to choose.)

If waiting costs the long rows (19-32 chunks) what it does not cost the short ones (4), an exchange
skewed by one item (publish an item's partials, finish the item before it) would buy it back.

    python3 benchmarks/probes/loss_wait_cost.py [variant,...] [SHAPE,...] [PROGRAMS [MAXNREG]]

PROGRAMS: the forward's grid set after its first call (a multiple of the rows' chunks), to tell the
cost of a row's chunks from that of a grid that leaves some units a program short; MAXNREG: its
register cap set with it (v47: 96 fits 5 programs of 4 warps an SM, where 128 fits 4).
"""
import dataclasses
import sys
import tempfile

import torch
from triton.testing import do_bench

from kernel_variant import edited_kernels
import portable_softmax as ps
from portable_softmax import launch, launch_compile, loss_launch

SHAPES = ["8192x32000", "8192x128256", "4096x151936", "4096x256000"]
WAIT = ("    if WAIT:\n"
        "        while tl.sum((v == EMPTY_SLOT).to(tl.int32)) > 0:\n"
        "            v = _read_slots(first_slot + peers, present, ATOMIC)\n")
EXCHANGE = ("            row_max, row_total = _exchange(slot_ptr, done_ptr, tile, chunk, row_mask, packed, BLOCK_M, "
            "CHUNKS,\n                                           CHUNKS_P2, MAXIMA_LSE, STAGES, WAIT_ATOMIC, PHASE)\n")


def variant_edits(name: str) -> dict[str, list[tuple[str, str]]]:
    """The (old, new) replacements of variant ``name``, by module of the kernel package; parts joined
    by ``+`` apply one after the other (``spread4+fresh``)."""
    edits: dict[str, list[tuple[str, str]]] = {}
    # ``fresh`` first: the others edit the addresses its text holds.
    for part in sorted(name.split("+"), key=lambda part: part != "fresh"):
        if part == "nowait":
            edits.setdefault("exchange", []).append((WAIT, ""))
        elif part == "noexchange":
            edits.setdefault("loss_split", []).append((EXCHANGE, "            row_max, row_total = chunk_max, total\n"))
        elif part == "pad" or part.startswith("spread"):
            # A row's slots SPREAD apart (spread4: one a 32-byte sector, spread16: one a line), the
            # row's first on a 128-byte line.
            spread = 1 if part == "pad" else int(part[len("spread"):])
            row = f"((CHUNKS_P2 * {spread} + 15) // 16 * 16)"
            edits.setdefault("exchange", []).extend([
                ("tl.arange(0, BLOCK_M)) * CHUNKS_P2\n", f"tl.arange(0, BLOCK_M)) * {row}\n"),
                ("slot_ptr + tile * CHUNKS_P2", f"slot_ptr + tile * {row}"),
                ("slots + chunk", f"slots + chunk * {spread}"),
                ("first_slot + peers", f"first_slot + peers * {spread}"),
                ("slots[:, None] + peers[None, :]", f"slots[:, None] + peers[None, :] * {spread}")])
        elif part == "fresh":
            # Each trip of the wait reads only the slots still empty.
            edits.setdefault("exchange", []).append((
                "            v = _read_slots(first_slot + peers, present, ATOMIC)\n",
                "            v = tl.where(v == EMPTY_SLOT, _read_slots(first_slot + peers, present & (v == EMPTY_SLOT),"
                " ATOMIC), v)\n"))
    return edits


def main() -> None:
    names = sys.argv[1].split(",") if len(sys.argv) > 1 else ["base", "nowait", "noexchange"]
    shapes = sys.argv[2].split(",") if len(sys.argv) > 2 else SHAPES
    programs = int(sys.argv[3]) if len(sys.argv) > 3 else None
    cap = int(sys.argv[4]) if len(sys.argv) > 4 else None
    folder = tempfile.mkdtemp()
    if any("pad" in name or "spread" in name for name in names):
        # Room for rows of slots spread and padded (at most 32 times a row's chunks).
        lookup = launch._Scratch.lookup
        launch._Scratch.lookup = lambda self, device, stream, slots, tiles: lookup(self, device, stream, 32 * slots,
                                                                                  tiles)
    modules = {name: edited_kernels(name, variant_edits(name), folder) for name in names}
    print(f"{'variant':>11} {'shape':>12} {'fwd+bwd ms':>10} {'floor':>6} plan", flush=True)
    for shape in shapes:
        n_rows, n_cols = (int(v) for v in shape.split("x"))
        x = (torch.randn(n_rows, n_cols, device="cuda", dtype=torch.bfloat16) * 3).requires_grad_()
        target = torch.randint(0, n_cols, (n_rows,), device="cuda")
        # A clone reads and writes the logits once: the forward + backward's floor.
        copy = do_bench(lambda: x.detach().clone(), warmup=10, rep=50, return_mode="median")
        for round_ in range(2):
            for name, module in modules.items():
                launch._kernel_module = loss_launch._kernel_module = lambda backend, module=module: module
                loss_launch._forget()
                launch_compile._resources_cache.clear()
                for pool in ("_scratch", "_ticket_scratch", "_counted_scratch", "_phased_scratch"):
                    setattr(launch, pool, launch._Scratch())

                def step() -> None:
                    x.grad = None
                    ps.cross_entropy(x, target).backward()

                step()
                if programs:
                    for key, record in loss_launch._records.items():
                        if key[0] == "forward":
                            if cap:
                                record.options = {**record.options, "maxnreg": cap}
                                record._compiled = False
                            record.plan = dataclasses.replace(record.plan, programs=programs)
                    step()
                ms = do_bench(step, warmup=10, rep=50, return_mode="median")
                if round_ == 0:
                    # The gradient's relative error against torch in float64 (nowait's and noexchange's
                    # are wrong by design).
                    xd = x.detach().double().requires_grad_()
                    torch.nn.functional.cross_entropy(xd, target).backward()
                    step()
                    error = ((x.grad.double() - xd.grad).norm() / xd.grad.norm()).item()
                    print(f"{name:>11} {shape:>12} gradient error {error:.2e}", flush=True)
                    del xd
                plans = {record.plan for key, record in loss_launch._records.items() if key[0] == "forward"}
                text = "; ".join(f"{p.regime} p{p.programs} w{p.num_warps} c{p.block_n} x{p.chunks} s{p.num_stages} "
                                 f"occ{p.occupancy}" for p in plans)
                print(f"{name:>11} {shape:>12} {ms:10.3f} {copy / ms:6.2f} {text}", flush=True)
        del x, target
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
