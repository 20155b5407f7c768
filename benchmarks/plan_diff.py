"""What a change moved in the planner's choices: every launch ``portable-softmax warmup`` would plan
(softmax and the cross-entropy, forward alone and with the backward) for recorded chips, shapes and
dtypes, one line a launch, from the shipped resource tables of the Triton in use; with ``--base
REV``, the same from REV's package (``git archive``d into a temporary folder, run in a process of
its own) and the lines that differ. No GPU: plans are pure functions of a chip's record, its
tuning and the tables (the NOTES' "plans of N shapes unchanged" checks).

    python benchmarks/plan_diff.py --base main                # what this tree moves
    PYTHONPATH=/path/to/triton36 python benchmarks/plan_diff.py --base main --profile h200
"""
from __future__ import annotations

import argparse
import difflib
import os
import subprocess
import sys
import tempfile

PROFILES = ("h200", "h100", "mi300x")
# The bench's vocabularies, odd ones (rows off 16-byte boundaries), aligned ones that pad their last
# chunk, rows of 6 to 38 chunks, and short batches.
SHAPES = ("8192x32000", "4096x50257", "8192x128256", "4096x151936", "4096x256000", "16384x128256",
          "8192x32001", "4096x151937", "8192x128257", "4096x50304", "4096x57600", "4096x53248", "4096x49152",
          "4096x65536", "4096x100352", "2048x262144", "64x50304", "1x50304")
DTYPES = ("bfloat16", "float32")


def plan_lines(profiles: list[str], shapes: list[str], dtypes: list[str]) -> list[str]:
    """One line a planned launch: chip, dtype, whether the backward is planned, shape, function,
    launch, and the plan's regime, block, chunks, warps, stages, programs an SM, windows, ticket
    and grid."""
    import triton

    from portable_softmax.kernel_resources import table_for
    from portable_softmax.profiles import profile_record
    from portable_softmax.targets import target_for
    from portable_softmax.warmup import plan_call, warmup_calls

    lines = []
    for name in profiles:
        record = profile_record(name)
        target = target_for(record)
        table = table_for(record.backend, record.arch, triton.__version__)
        for dtype in dtypes:
            for backward in (True, False):
                for text in shapes:
                    shape = tuple(int(n) for n in text.split("x"))
                    for call in warmup_calls([shape], [dtype], [-1], log=False, backward=backward, loss=True):
                        for launch in plan_call(target, table, call):
                            p = launch.plan
                            lines.append(f"{name} {dtype} {'fwd+bwd' if backward else 'fwd'} {text} {call.function} "
                                         f"{launch.what}: {p.regime} block {p.block_n} chunks {p.chunks} warps "
                                         f"{p.num_warps} stages {p.num_stages} occupancy {p.occupancy} align "
                                         f"{p.align} ticketed {p.ticketed} programs {p.programs}")
    return lines


def _base_lines(rev: str, argv: list[str]) -> list[str]:
    """``plan_lines`` of REV's package: this script run in a process with REV's package first on
    the path (the Triton in use, and whatever else, as this process has them)."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with tempfile.TemporaryDirectory() as folder:
        archive = subprocess.run(["git", "-C", root, "archive", rev, "portable_softmax"], check=True,
                                 capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", folder], input=archive, check=True)
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [folder, os.environ.get("PYTHONPATH")])))
        found = subprocess.run([sys.executable, os.path.abspath(__file__), *argv], env=env, check=True,
                               capture_output=True, text=True).stdout
    return found.splitlines()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", help="a git revision: print the lines that differ from its plans")
    parser.add_argument("--profile", action="append", help=f"repeat (default: {' '.join(PROFILES)})")
    parser.add_argument("--shape", action="append", help="ROWSxCOLS, repeat (default: 18 loss shapes)")
    parser.add_argument("--dtype", action="append", help=f"repeat (default: {' '.join(DTYPES)})")
    args = parser.parse_args()
    selection = [f"--{flag}={value}" for flag in ("profile", "shape", "dtype") for value in getattr(args, flag) or []]
    lines = plan_lines(args.profile or list(PROFILES), args.shape or list(SHAPES), args.dtype or list(DTYPES))
    if not args.base:
        print("\n".join(lines))
        return
    base = _base_lines(args.base, selection)
    moved = [line for line in difflib.unified_diff(base, lines, args.base, "this tree", n=0, lineterm="")
             if not line.startswith("@@")]
    print("\n".join(moved) if moved else f"no plan moved ({len(lines)} launches)")


if __name__ == "__main__":
    main()
