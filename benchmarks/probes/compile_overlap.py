"""Whether two Triton compiles in two threads of one process overlap (issue 34 item 4): the pairs a
cold first call compiles one after the other, the softmax's split forward then its split backward,
the cross-entropy's split forward (with the gradient) then the gradient-rescale kernel, and a
sliced column softmax's partials then its normalize.

The variants are found as ``first_call_compiles.py`` finds them (an sm_90 record, launches
stubbed). Each pair is then compiled for sm_90 in a fresh process with an empty Triton cache,
either one after the other or the second in a thread started as the first begins, and timed from
the first compile's start to the last one's end; the process's once-only costs (``triton_key``,
importing the kernels) are paid before the clock starts. On a Triton that builds a C launcher per
signature with gcc (3.6), each compile is followed by that build, as a first launch does. Runs
alternate between the two ways; the best and the median of ``--repeat`` each are printed, and
whether every run built the same binaries (a race inside the compiler would show there). Run with
``PYTHONPATH`` at a Triton 3.6 target to see the GPU host's release.

Then the same first calls through the package (``--calls``): ``ps.softmax(x).backward(dy)``,
``ps.cross_entropy(logits, target).backward()`` and ``ps.softmax(columns, 0)``, each in a fresh
process with an empty cache, the launch layer pointed at the recorded chip, the compile below the
package's compile door (``launch_compile._compile``) a real sm_90 compile (and launcher build), the
launches stubbed (a first launch asks the door for its binaries, as ``LaunchRecord``'s does); timed
with the second compile started beside the first's (``launch_compile.compile_ahead``: the
backward's, the sliced normalize's) and without; with ``--timeline``, each way's median run's
per-thread timeline (``compile_timeline.py``).

    PYTHONPATH=.[:/tmp/t36] python benchmarks/probes/compile_overlap.py [--repeat N] [--profile h200] [--calls]
        [--timeline]
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

from portable_softmax import variants

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import compile_stages as stages  # noqa: E402  (sets the environment: no interpreter, an empty cache)
import first_call_compiles as found  # noqa: E402

PAIRS = {"softmax fwd+bwd 4096x50257 bf16": "softmax+backward 4096x50257 bf16",
         "cross_entropy fwd+bwd 4096x50257 bf16": "cross_entropy fwd+bwd 4096x50257 bf16",
         "column softmax 32768x1024 bf16, dim 0": "column softmax 32768x1024 bf16 dim 0"}


def _specs(case: str, profile: str) -> list[dict[str, Any]]:
    specs = stages.Specs()
    found.install(specs, profile)
    found.CASES[case]()
    return specs.specs


def _build(spec: dict[str, Any]) -> tuple[float, str]:
    """One compile as a first launch makes it (the kernel, then its launcher where gcc builds one):
    when it ended, and a digest of its binary."""
    from portable_softmax.crosscompile.compiling import compiled_variant

    compiled = compiled_variant(spec)[0]
    stages.launcher_seconds(compiled)
    return time.perf_counter(), hashlib.sha256(compiled.asm["cubin"]).hexdigest()[:16]


def _one(specs: list[dict[str, Any]], threaded: bool) -> dict[str, float]:
    import triton
    from triton.runtime.cache import triton_key

    from portable_softmax import compat, kernels

    triton_key()
    if compat.JIT_HASH_BY_ORDER:
        compat.settle_jit_hashes(kernels)
    ends: dict[int, tuple[float, str]] = {}
    started = time.perf_counter()
    if threaded:
        workers = [threading.Thread(target=lambda i=i: ends.__setitem__(i, _build(specs[i])))
                   for i in range(1, len(specs))]
        for worker in workers:
            worker.start()
        ends[0] = _build(specs[0])
        for worker in workers:
            worker.join()
    else:
        for i, spec in enumerate(specs):
            ends[i] = _build(spec)
    return {"wall": max(end for end, _ in ends.values()) - started, "first": ends[0][0] - started,
            "binaries": [ends[i][1] for i in range(len(specs))], "triton": triton.__version__}


def _call(case: str, profile: str, ahead: bool, timeline: bool = False) -> dict[str, Any]:
    """The first call of ``case`` through the package, compiles real (module docstring)."""
    from portable_softmax import launch, launch_compile, loss_launch, op_calls
    from portable_softmax.backend import get_backend
    from portable_softmax.crosscompile.checks import cubin_resources
    from portable_softmax.crosscompile.compiling import compiled_variant
    from portable_softmax.profiles import profile_record
    from portable_softmax.record import KernelResources
    from triton.runtime.cache import triton_key

    record, backend = profile_record(profile), get_backend("cuda")
    compiles: list[tuple[str, float, float]] = []

    def compile(kernel: Any, args: tuple, constexprs: dict, options: dict) -> KernelResources:
        spec = {"target": found.TARGET, "kernel": kernel.fn.__name__, "args": [found._arg(a) for a in args],
                "constexprs": dict(constexprs), "options": dict(options)}
        began = time.perf_counter()
        compiled = compiled_variant(spec)[0]
        stages.launcher_seconds(compiled)
        compiles.append((kernel.fn.__name__, began - started, time.perf_counter() - started))
        usage = cubin_resources(compiled.asm["cubin"], compiled.metadata.name)
        return KernelResources(usage["REG"], compiled.metadata.shared, options["num_warps"],
                               (usage.get("LOCAL", 0) + usage.get("STACK", 0)) // 4)

    class Record:
        """A launch record that launches nothing: its first call asks the compile door for its
        binaries, as ``LaunchRecord``'s first launch does (``LaunchRecord.compile``)."""

        compile = launch.LaunchRecord.compile

        def __init__(self, kernel, backend_, device, plan, scalars, launches, options, fallback) -> None:
            self.kernel, self.backend, self.device, self.plan = kernel, backend_, device, plan
            self.scalars, self.launches, self.options, self.done = scalars, launches, options, False
            self._slots = plan.regime == "split"
            self._arity = len(variants.TENSORS["backward" if kernel.fn.__name__.startswith("softmax_backward")
                                                else "forward"])
            self._pad = plan.regime in variants.FUSED_REGIMES and kernel.fn.__name__.startswith("softmax_")

        def __call__(self, tensors):
            if not self.done:
                self.compile(tensors)
                self.done = True
            return self.plan

    for module in (launch, loss_launch, launch_compile):
        module.backend_for = lambda device: backend
        module.device_record = lambda device: record
    launch.LaunchRecord = loss_launch.LaunchRecord = Record
    launch_compile._compile = compile
    if not ahead:
        op_calls.compile_ahead = loss_launch.compile_ahead = launch.compile_ahead = lambda device, work: None
    if timeline:  # after the stubs above: it wraps the compile they put in
        import compile_timeline

        compile_timeline.install()
    triton_key()
    # As first_call.py's timed processes: torch's first backward(gradient) imports it (sympy).
    import torch.fx.experimental.symbolic_shapes  # noqa: F401
    started = time.perf_counter()
    found.CASES[case]()
    wall = time.perf_counter() - started
    return {"wall": wall, "compiles": compiles,
            **({"timeline": compile_timeline.report(started)} if timeline else {})}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--profile", default="h200")
    parser.add_argument("--calls", action="store_true", help="time the first calls through the package")
    parser.add_argument("--timeline", action="store_true", help="with --calls: each way's per-thread timeline")
    parser.add_argument("--one", help=argparse.SUPPRESS)
    parser.add_argument("--call", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        specs, threaded = json.loads(args.one)
        print(json.dumps(_one(specs, threaded)))
        return 0
    if args.call:
        case, ahead = json.loads(args.call)
        print(json.dumps(_call(case, args.profile, ahead, args.timeline)))
        return 0
    if args.calls:
        return _calls(args.repeat, args.profile, args.timeline)
    print(f"{'pair':<40} {'how':<10} {'best s':>7} {'median s':>8} {'first ends':>10}  (fresh process, empty cache)")
    for label, case in PAIRS.items():
        specs = _specs(case, args.profile)
        print(f"{label}: " + ", ".join(f"{s['kernel']} {found._short(s['constexprs'])}" for s in specs), flush=True)
        runs: dict[bool, list[dict[str, float]]] = {False: [], True: []}
        for _ in range(args.repeat):
            for threaded in (False, True):
                env = {**os.environ, "TRITON_CACHE_DIR": tempfile.mkdtemp(prefix="compile-overlap-")}
                out = subprocess.run([sys.executable, __file__, "--one", json.dumps([specs, threaded])], env=env,
                                     check=True, capture_output=True, text=True).stdout
                runs[threaded].append(json.loads(out.strip().splitlines()[-1]))
        binaries = {tuple(r["binaries"]) for results in runs.values() for r in results}
        print(f"  the same binaries in every run, in turn and in threads: {'yes' if len(binaries) == 1 else 'NO'}")
        for threaded, results in runs.items():
            walls = [r["wall"] for r in results]
            print(f"  {'':<38} {'threads' if threaded else 'in turn':<10} {min(walls):7.2f} "
                  f"{statistics.median(walls):8.2f} {statistics.median(r['first'] for r in results):10.2f}  "
                  f"triton {results[0]['triton']}", flush=True)
    return 0


def _calls(repeat: int, profile: str, timeline: bool) -> int:
    print(f"{'first call':<40} {'2nd compile':<12} {'best s':>7} {'median s':>8}  compiles (kernel: start-end s)")
    for label, case in PAIRS.items():
        runs: dict[bool, list[dict[str, Any]]] = {False: [], True: []}
        for _ in range(repeat):
            for ahead in (False, True):
                env = {**os.environ, "TRITON_CACHE_DIR": tempfile.mkdtemp(prefix="compile-overlap-")}
                out = subprocess.run([sys.executable, __file__, "--profile", profile, "--call",
                                      json.dumps([case, ahead]), *(["--timeline"] if timeline else [])], env=env,
                                     check=True, capture_output=True, text=True).stdout
                runs[ahead].append(json.loads(out.strip().splitlines()[-1]))
        for ahead, results in runs.items():
            walls = sorted(r["wall"] for r in results)
            middle = sorted(results, key=lambda r: r["wall"])[len(results) // 2]
            spans = ", ".join(f"{name}: {start:.2f}-{end:.2f}" for name, start, end in middle["compiles"])
            print(f"{label:<40} {'beside' if ahead else 'after':<12} {walls[0]:7.2f} {statistics.median(walls):8.2f}"
                  f"  {spans}", flush=True)
            for line in middle.get("timeline", []):
                print(f"    {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
