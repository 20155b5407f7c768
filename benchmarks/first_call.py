"""A cold first call against Liger's (issue 34 item 4): each case in a fresh Python process with an
empty Triton cache (``mktemp -d``), the call timed from before it to ``torch.cuda.synchronize()``
after it (imports and the inputs' allocation done before the clock starts); then the same with
the cache the cold run left (a fresh process, a warm disk cache); then ``portable-softmax
warmup`` into an empty cache, and a fresh process's first call with that cache. Kernels compiled:
the group files Triton wrote into the cache during the call. Where a call after the warmup still
compiles, the compile keys of the call and of the warmup, each in a fresh process, and those of
the call the warmup lacks are printed: what Triton's JIT reports (``jit_cache_hook``: kernel,
signature, constexprs, specialisation attrs, options) and the function's own key, which Triton's
disk cache keys on beside them and the JIT's report leaves out (its source and its callees', and
their constexpr globals: under Triton 3.6 it depended on the kernels hashed before it, which is
why the report once came back empty while a compile happened).

Every timed process, ours and Liger's, imports torch's ``torch.fx.experimental.symbolic_shapes``
before its timer (``_TORCH_FIRST_USE``): torch's first ``backward(gradient)`` imports it (sympy,
about 2 s), which a training step's ``loss.backward()`` does not, and which importing Liger had
already done. The timer holds the first call's own cost, in a process that has imported its
libraries, as a training process has before its first step.

The forward + backward cases and the column case (sliced: two launches) are also timed cold with
nothing compiled ahead (``ours-serial``: each backward compiled at the backward, each sliced
normalize at its launch) instead of beside the compile before it (``launch_compile.compile_ahead``:
a backward's beside its forward's, a sliced normalize's beside its partials'): what the overlap
saves on the host at hand. With ``--timeline``, the cold runs of ours of those cases (both ways)
also print a per-thread timeline of their compiles (``probes/compile_timeline.py``: the
door, Triton's JIT misses, stages, launcher builds and module loads, lock waits; then how long
two threads compiled at once).

Target: every cold first call of ours no slower than Liger's of the same case, or 1.5 s.

    python benchmarks/first_call.py [--out DIR] [--case NAME ...] [--timeline]   (a GPU; Liger where importable)
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Any

TARGET_S = 1.5
# The cases of ours that compile ahead (``launch_compile.compile_ahead``): a backward beside its
# forward, the sliced column's normalize beside its partials.
AHEAD_KINDS = ("backward", "loss", "loss_alone", "column")

# name: (our call, Liger's call or None, warmup arguments for `portable-softmax warmup`)
CASES = {
    "softmax 4096x50257 bf16": ("softmax", "softmax", "--shape 4096x50257 --dtype bfloat16"),
    "softmax 32x128256 fp32": ("softmax_fp32", "softmax_fp32", "--shape 32x128256 --dtype float32"),
    "softmax fwd+bwd 4096x50257 bf16": ("backward", "backward", "--shape 4096x50257 --dtype bfloat16 --backward"),
    "column softmax 32768x1024 bf16, dim 0": ("column", None, "--shape 32768x1024 --dtype bfloat16 --dim 0"),
    "attention 8x16x1024x1024 bf16, scale, bool mask": ("attention", "attention", None),
    "cross_entropy fwd+bwd 4096x50257 bf16": ("loss", "loss", "--shape 4096x50257 --dtype bfloat16 --loss --backward"),
    # The forward alone (no grad): its stream, and the counted sum compiled beside it (NOTES v40).
    "cross_entropy 4096x50257 bf16": ("loss_alone", "loss_alone", "--shape 4096x50257 --dtype bfloat16 --loss"),
}


def _inputs(kind: str):
    import torch

    cuda = torch.device("cuda")
    if kind in ("softmax", "backward"):
        return (torch.randn(4096, 50257, dtype=torch.bfloat16, device=cuda, requires_grad=kind == "backward"),)
    if kind == "softmax_fp32":
        return (torch.randn(32, 128256, device=cuda),)
    if kind == "column":
        return (torch.randn(32768, 1024, dtype=torch.bfloat16, device=cuda),)
    if kind == "attention":
        keep = torch.rand(8, 1, 1, 1024, device=cuda) > 0.1
        return torch.randn(8, 16, 1024, 1024, dtype=torch.bfloat16, device=cuda), keep
    logits = torch.randn(4096, 50257, dtype=torch.bfloat16, device=cuda, requires_grad=True)
    return logits, torch.randint(0, 50257, (4096,), device=cuda)


def _ours(kind: str, inputs) -> None:
    import torch

    import portable_softmax as ps

    if kind in ("softmax", "softmax_fp32"):
        ps.softmax(inputs[0], -1)
    elif kind == "backward":
        ps.softmax(inputs[0], -1).backward(inputs[0].detach())
    elif kind == "column":
        ps.softmax(inputs[0], 0)
    elif kind == "attention":
        ps.softmax(inputs[0], -1, scale=0.125, mask=inputs[1])
    elif kind == "loss_alone":
        with torch.no_grad():
            ps.cross_entropy(*inputs)
    else:
        ps.cross_entropy(*inputs).backward()


def _liger(kind: str, inputs) -> None:
    import torch
    from liger_kernel.ops.cross_entropy import LigerCrossEntropyFunction
    from liger_kernel.ops.softmax import LigerSoftmaxFunction

    if kind in ("softmax", "softmax_fp32"):
        LigerSoftmaxFunction.apply(inputs[0])
    elif kind == "backward":
        LigerSoftmaxFunction.apply(inputs[0]).backward(inputs[0].detach())
    elif kind == "attention":  # Liger has no masked softmax: its plain softmax of the scores
        LigerSoftmaxFunction.apply(inputs[0] * 0.125)
    elif kind == "loss_alone":
        with torch.no_grad():
            LigerCrossEntropyFunction.apply(*inputs, None)
    else:
        LigerCrossEntropyFunction.apply(*inputs, None)[0].backward()


def compile_key(fn: Any, compile: dict, described: str) -> dict:
    """A compile's key as Triton's disk cache sees it, but for what every process of one machine
    and Triton shares (Triton's own hash, the backend's, the environment): the JIT's key as Triton
    serialises it (kernel, signature, constexprs, specialisation attrs, options) and the
    function's (``JITFunction.cache_key``, which the JIT's leaves out)."""
    return {"jit": compile.get("specialization_data") or described, "function": fn.jit_function.cache_key}


def _record_compiles() -> list:
    """Every compile Triton's JIT makes in this process (a disk-cache hit included), by
    ``compile_key``. Through ``knobs.runtime.jit_cache_hook``, which returns None: the compile
    goes on."""
    from triton import knobs

    found: list = []

    def hook(*, key, repr, fn, compile, is_manual_warmup, already_compiled, **_):
        found.append(compile_key(fn, compile, repr))

    knobs.runtime.jit_cache_hook = hook
    return found


def missed(call: list[dict], warmup: list[dict]) -> list[str]:
    """The keys of ``call`` that ``warmup`` lacks, each said in a line: where the warmup compiled
    the same JIT key, only the function's key differs (its source or its callees' as hashed)."""
    lines = []
    for key in call:
        if key in warmup:
            continue
        twins = [other["function"] for other in warmup if other["jit"] == key["jit"]]
        if twins:
            lines.append(f"the same JIT key, the function keyed {key['function'][:12]} here, {twins[0][:12]} by the "
                         f"warmup: {key['jit']}")
        else:
            lines.append(f"a JIT key the warmup did not compile: {key['jit']}")
    return lines


def compile_keys(kind: str, warm_args: str | None) -> list:
    """The keys of what ``warm_args``' warmup compiles (``warmup.run_call`` of each of its calls,
    as ``portable-softmax warmup`` makes them), or with None of what our first call of ``kind``
    compiles."""
    import torch

    found = _record_compiles()
    if warm_args is None:
        inputs = _inputs(kind)
        _ours(kind, inputs)
    else:
        from portable_softmax import cli, warmup

        args = cli.build_parser().parse_args(["warmup", *warm_args.split()])
        for call in warmup.warmup_calls(args.shape, args.dtype or ["bfloat16"], args.dim or [-1], log=args.log,
                                        backward=args.backward, loss=args.loss):
            warmup.run_call(call, torch.device("cuda"))
    torch.cuda.synchronize()
    return found


def _key_difference(kind: str, warm_args: str) -> list[str]:
    """The compile keys of the first call that its warmup did not compile (fresh processes, empty
    caches): what Triton's cache misses after the warmup."""
    keys = {}
    for which, extra in (("warmup", [warm_args]), ("call", [])):
        cache = tempfile.mkdtemp(prefix="first-call-keys-")
        done = subprocess.run([sys.executable, __file__, "--keys", kind, *extra], capture_output=True, text=True,
                              env={**os.environ, "TRITON_CACHE_DIR": cache}, timeout=300)
        if done.returncode != 0:
            return [f"{which}: {(done.stderr.strip().splitlines() or ['failed'])[-1][:200]}"]
        keys[which] = json.loads(done.stdout.strip().splitlines()[-1])
    return missed(keys["call"], keys["warmup"])


def _cache_kernels(folder: str) -> int:
    return sum(name.startswith("__grp__") for _, _, names in os.walk(folder) for name in names)


# Imported by every timed process before its timer (the module docstring says why).
_TORCH_FIRST_USE = "torch.fx.experimental.symbolic_shapes"


def one(kind: str, impl: str, timeline: bool = False) -> dict:
    """Time the first call of ``kind`` by ``impl`` in this process (``ours-serial``: ours with
    nothing compiled ahead, each binary at its launch or its record's build); with ``timeline``,
    ours' compiles' timeline (``probes/compile_timeline.py``) as the result's ``timeline``."""
    import importlib
    import threading

    import torch

    importlib.import_module(_TORCH_FIRST_USE)
    inside = [0.0, 0]
    ahead = [0.0, 0]
    if impl == "liger":
        import liger_kernel.ops.cross_entropy  # noqa: F401
        import liger_kernel.ops.softmax  # noqa: F401
        call = _liger
    else:
        from portable_softmax import launch, launch_compile, loss_launch, op_calls

        if timeline:
            sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "probes"))
            import compile_timeline

            compile_timeline.install()
        compiled = launch._compiled_resources

        def timed(*args):
            # The compile door (planning's, a first launch's; a hit or a wait included): by the call,
            # or by a thread compiling ahead (a backward beside its forward, a sliced normalize beside
            # its partials).
            started = time.perf_counter()
            try:
                return compiled(*args)
            finally:
                which = ahead if threading.current_thread().name == launch_compile.AHEAD_THREAD else inside
                which[0] += time.perf_counter() - started
                which[1] += 1
        launch._compiled_resources = loss_launch._compiled_resources = timed
        if impl == "ours-serial":
            op_calls.compile_ahead = loss_launch.compile_ahead = launch.compile_ahead = lambda device, work: None
        call = _ours
    inputs = _inputs(kind)
    torch.cuda.synchronize()
    folder = os.environ["TRITON_CACHE_DIR"]
    before = _cache_kernels(folder)
    started = time.perf_counter()
    call(kind, inputs)
    torch.cuda.synchronize()
    return {"seconds": round(time.perf_counter() - started, 3), "compiled": _cache_kernels(folder) - before,
            "in_compile": round(inside[0], 3), "compile_requests": inside[1], "ahead_compile": round(ahead[0], 3),
            "ahead_requests": ahead[1],
            **({"timeline": compile_timeline.report(started)} if timeline and impl != "liger" else {})}


def _fresh(kind: str, impl: str, cache: str, timeline: bool = False) -> dict:
    """``one`` in a fresh process with ``cache`` as Triton's cache."""
    done = subprocess.run([sys.executable, __file__, "--one", kind, impl, *(["--timeline"] if timeline else [])],
                          env={**os.environ, "TRITON_CACHE_DIR": cache}, capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        return {"error": (done.stderr.strip().splitlines() or ["exit %d" % done.returncode])[-1][:120]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def _liger_present() -> bool:
    try:
        import liger_kernel.ops.softmax  # noqa: F401
        return True
    except Exception:  # noqa: BLE001  (not carried, or built for another torch)
        return False


def _cell(result: dict | None) -> str:
    if result is None:
        return f"{'-':>15}"
    if "error" in result:
        return f"{'error':>15}"
    return f"{result['seconds']:>7.2f} s ({result['compiled']:>2})"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--case", action="append", choices=sorted(CASES))
    parser.add_argument("--out", help="folder for first_call.json")
    parser.add_argument("--timeline", action="store_true",
                        help="print the compiles' per-thread timeline of the cold runs of the cases that compile "
                             "ahead (forward + backward, the sliced column)")
    parser.add_argument("--one", nargs=2, help=argparse.SUPPRESS)
    parser.add_argument("--keys", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.keys:
        print(json.dumps(compile_keys(args.keys[0], args.keys[1] if len(args.keys) > 1 else None)))
        return 0
    if args.one:
        print(json.dumps(one(*args.one, timeline=args.timeline)))
        return 0
    liger = _liger_present()
    rows = []
    print(f"{'case':<48} {'ours cold (compiled)':>20} {'Liger cold':>15} {'ours warm':>15} {'Liger warm':>15} "
          f"{'after warmup':>15}  verdict", flush=True)
    for name in args.case or CASES:
        ours_kind, liger_kind, warm_args = CASES[name]
        row = {"case": name}
        both_ways = ours_kind in AHEAD_KINDS
        for impl, kind in (("ours", ours_kind), ("liger", liger_kind if liger else None)):
            if kind is None:
                continue
            cache = tempfile.mkdtemp(prefix=f"first-call-{impl}-")
            row[f"{impl}_cold"] = _fresh(kind, impl, cache, args.timeline and both_ways and impl == "ours")
            row[f"{impl}_warm"] = _fresh(kind, impl, cache)
        if both_ways:
            # The same cold call with nothing compiled ahead: what the compile ahead saves.
            row["ours_cold_serial"] = _fresh(ours_kind, "ours-serial", tempfile.mkdtemp(prefix="first-call-serial-"),
                                             args.timeline)
        if warm_args is not None:
            cache = tempfile.mkdtemp(prefix="first-call-warmup-")
            done = subprocess.run([sys.executable, "-m", "portable_softmax", "warmup", "--no-progress",
                                   *warm_args.split()], env={**os.environ, "TRITON_CACHE_DIR": cache},
                                  capture_output=True, text=True, timeout=300)
            row["warmup"] = done.stdout.strip().splitlines()[-1:] if done.returncode == 0 else done.stderr[-300:]
            row["after_warmup"] = _fresh(ours_kind, "ours", cache)
            if row["after_warmup"].get("compiled"):
                row["missed_keys"] = _key_difference(ours_kind, warm_args)
        cold = row["ours_cold"].get("seconds", float("inf"))
        bound = max(TARGET_S, row.get("liger_cold", {}).get("seconds", 0.0))
        row["ok"] = cold <= bound
        rows.append(row)
        print(f"{name:<48} {_cell(row['ours_cold']):>20} {_cell(row.get('liger_cold')):>15} "
              f"{_cell(row['ours_warm']):>15} {_cell(row.get('liger_warm')):>15} {_cell(row.get('after_warmup')):>15}"
              f"  {'ok' if row['ok'] else 'SLOWER'} (bound {bound:.2f} s)", flush=True)
    print(f"cold: a fresh process, an empty Triton cache; warm: a fresh process, the cache the cold run left; "
          f"(n): kernels compiled in the call. Liger: {'from .whl' if liger else 'not importable'}")
    print(f"each timed process imported its library and {_TORCH_FIRST_USE} before its timer: torch's first "
          f"backward(gradient) imports it (sympy, ~2 s) and a training step's loss.backward() does not; Liger's "
          f"import had loaded it")
    for row in rows:
        cold = row["ours_cold"]
        if "in_compile" in cold:
            print(f"  {row['case']}: ours cold {cold['seconds']:.2f} s, of which {cold['in_compile']:.2f} s waiting at "
                  f"the compile door ({cold['compile_requests']} requests: planning's and first launches'; Triton's "
                  f"compile and its launcher's; a sliced record's build's), beside it "
                  f"{cold.get('ahead_compile', 0.0):.2f} s of compiles started ahead "
                  f"({cold.get('ahead_requests', 0)} requests: a backward's, a sliced normalize's)")
        serial = row.get("ours_cold_serial", {})
        if "seconds" in serial:
            print(f"  {row['case']}: ours cold with nothing compiled ahead (each binary at its launch or build): "
                  f"{serial['seconds']:.2f} s, {serial['in_compile']:.2f} s at the compile door")
    for row in rows:
        for which, how in (("ours_cold", "with compiles ahead"),
                           ("ours_cold_serial", "with nothing compiled ahead")):
            if row.get(which, {}).get("timeline"):
                print(f"  {row['case']}: ours cold, {how}: its compiles' timeline (ms from "
                      f"the call's start; main: the call's thread, ahead: compile_ahead's)")
                for line in row[which]["timeline"]:
                    print(f"    {line}")
    for row in rows:
        for line in row.get("missed_keys", []):
            print(f"  {row['case']}: compiled after the warmup, not by it: {line}")
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "first_call.json"), "w") as handle:
            json.dump(rows, handle, indent=2)
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
