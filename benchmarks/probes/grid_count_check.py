"""Does the split loss forward that counts its 'mean''s targets itself (``kernels/grid_count.py``)
finish, and match torch? Each case runs in a process of its own under a time limit (a grid that
waits on an arrival that never comes hangs its process, not the probe), with the count and, for
comparison, with it turned off (``variants.loss_counts`` answering no: the stats kernel's path).

    PYTHONPATH=. python benchmarks/probes/grid_count_check.py [--limit 90] [--case 8192x32000:bfloat16 ...]

Each line: the case, the form, the plan's regime and COUNTED, three calls back to back (each
ignoring another share of the positions), the relative error of the loss and gradient against
torch's in float32, and the seconds the process took (``HANG`` where it ran past the limit).
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import time

CASES = ("8192x32000:bfloat16", "4096x50257:bfloat16", "4096x256000:bfloat16", "8192x32000:float32")


def child(case: str, counted: bool, limit: float) -> None:
    import faulthandler

    import torch

    # Where a hung process waits (a launch compiling, or a synchronisation on a kernel that runs
    # on): its stacks on stderr before the limit ends it.
    faulthandler.dump_traceback_later(max(limit - 15, 5), exit=False)

    import portable_softmax as ps
    from portable_softmax import loss_launch, variants
    from portable_softmax.selfcheck import relative_error

    if not counted:
        variants.loss_counts = lambda config, facts: False  # the stats kernel's path
    shape, dtype = case.split(":")
    rows, cols = (int(n) for n in shape.split("x"))
    dtype = getattr(torch, dtype)
    errors = []
    for share in (0.1, 0.6, 0.3):
        x = (torch.randn(rows, cols, device="cuda") * 3).to(dtype).requires_grad_()
        target = torch.randint(0, cols, (rows,), device="cuda")
        target[torch.rand(rows, device="cuda") < share] = -100
        start = time.perf_counter()
        loss = ps.cross_entropy(x, target)
        launched = time.perf_counter() - start
        torch.cuda.synchronize()
        print(f"  share {share}: launched in {launched:.1f} s, done in {time.perf_counter() - start:.1f} s",
              file=sys.stderr, flush=True)
        loss.backward()
        leaf = x.detach().float().requires_grad_()
        theirs = torch.nn.functional.cross_entropy(leaf, target)
        theirs.backward()
        errors.append((relative_error(loss.float(), theirs), relative_error(x.grad.float(), leaf.grad)))
    torch.cuda.synchronize()
    (record,) = [r for key, r in loss_launch._records.items() if key[0] == "forward"][-1:]
    print(f"{case:22s} {'counted' if counted else 'stats':8s} {record.plan.regime:6s} "
          f"COUNTED={bool(record.launches[0].get('COUNTED'))} programs={record.plan.programs} "
          f"stages={record.plan.num_stages} errors " + " ".join(f"{a:.1e}/{b:.1e}" for a, b in errors), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--case", action="append", help=f"NxV:dtype, repeatable (default {CASES})")
    parser.add_argument("--limit", type=float, default=90.0, help="seconds a case's process may take")
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child[0], args.child[1] == "counted", args.limit)
        return
    for case in args.case or CASES:
        for form in ("counted", "stats"):
            start = time.perf_counter()
            try:
                done = subprocess.run([sys.executable, __file__, "--child", case, form, "--limit", str(args.limit)],
                                      capture_output=True, text=True, timeout=args.limit)
                out = done.stdout.strip() or done.stderr.strip()[-1500:]
                print(f"{out}  ({time.perf_counter() - start:.0f} s)", flush=True)
                print(done.stderr.strip()[-400:], flush=True)
            except subprocess.TimeoutExpired as hung:
                print(f"{case:22s} {form:8s} HANG (past {args.limit:.0f} s)", flush=True)
                stderr = hung.stderr.decode(errors="replace") if isinstance(hung.stderr, bytes) else hung.stderr or ""
                print(stderr[-2500:], flush=True)


if __name__ == "__main__":
    main()
