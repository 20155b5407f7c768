"""How many kernels a cold first call compiles, and how long each compile takes, measured on a
machine without a GPU (issue 34 item 4).

Each case's first call runs through the public API on CPU tensors of the case's shape, with the
launch layer told that the device is an H100 (its recorded profile) and its compile entry point
(``launch._compiled_resources``) replaced by a real cross-compile for sm_90 (``crosscompile``'s
``compile_variant``, Triton's own compiler, in this process, with an empty Triton cache). Nothing
launches: the launch records are stubs that note the variants they would launch, which the real
first launch compiles if planning did not (a two-launch split's second phase), and those a sliced
record's build compiles (its phases: here the normalize's at its first launch, the CPU device being
an interpreted one to ``compile_ahead``). The time is what these compiles take on this machine's
CPU, not an H100 host's. With ``--detail``, each compile and what each record launches (its plan and
options): run it with ``PYTHONPATH`` at another copy of the package to compare the plans two
versions make.

    PYTHONPATH=. python benchmarks/probes/first_call_compiles.py [--case NAME ...] [--detail]
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable

os.environ.pop("TRITON_INTERPRET", None)  # real JIT functions: compiled for sm_90, not interpreted
os.environ.setdefault("TRITON_CACHE_DIR", tempfile.mkdtemp(prefix="first-call-cache-"))
os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")  # the grad-scale kernel leaves it unset

import torch  # noqa: E402

import portable_softmax as ps  # noqa: E402
from portable_softmax import launch, loss_launch, variants  # noqa: E402
from portable_softmax.backend import get_backend  # noqa: E402
from portable_softmax.crosscompile.cases import _int_type  # noqa: E402
from portable_softmax.crosscompile.compiling import compile_variant  # noqa: E402
from portable_softmax.profiles import profile_record  # noqa: E402
from portable_softmax.record import KernelResources  # noqa: E402

TORCH_POINTERS = {torch.float16: "*fp16", torch.bfloat16: "*bf16", torch.float32: "*fp32", torch.float64: "*fp64",
                  torch.int64: "*i64", torch.int32: "*i32", torch.bool: "*i1"}
TARGET = ["cuda", 90, 32]


class Counter:
    """The compiles of one case: each variant compiled (planning's and the launches'), in order."""

    def __init__(self) -> None:
        self.compiles: list[tuple[str, float, str]] = []
        self.plans: list[str] = []
        self.seen: set[tuple] = set()

    def compile(self, kernel: Any, args: tuple, constexprs: dict, options: dict, why: str) -> dict[str, Any]:
        spec = {"target": TARGET, "kernel": kernel.fn.__name__, "args": [_arg(a) for a in args],
                "constexprs": dict(constexprs), "options": dict(options)}
        started = time.perf_counter()
        result = compile_variant(spec)
        self.compiles.append((f"{spec['kernel']} {_short(constexprs)} {_short(options)}",
                              time.perf_counter() - started, why))
        return result


def _arg(value: Any) -> tuple[str, Any]:
    if isinstance(value, torch.Tensor):
        return TORCH_POINTERS[value.dtype], value.data_ptr() % 16 == 0
    if isinstance(value, torch.dtype):  # the split scratch's placeholder
        return TORCH_POINTERS[value], True
    if isinstance(value, float):
        return "fp32", False
    kind = _int_type(value)
    return (kind, value) if kind == "constexpr" else (kind, value % 16 == 0)


def _short(values: dict) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(values.items()) if k in ("BLOCK_M", "BLOCK_N", "CHUNKS", "TICKETED",
                                                                   "STAGES", "PHASE", "num_warps", "maxnreg",
                                                                   "PER_TILE", "DENSE"))


def install(counter: Counter, profile: str = "h100") -> None:
    """Point the launch layer at a recorded chip (``profile``, an sm_90 one: the compiles are for
    sm_90) that compiles through ``counter``; stub the launches."""
    record = profile_record(profile)
    backend = get_backend("cuda")
    keys: dict[tuple, KernelResources] = {}

    def compiled_resources(kernel, backend_, device, args, constexprs, options):
        key = (kernel.fn.__name__, tuple(sorted(constexprs.items())), tuple(sorted(options.items())),
               launch._specialization(args))
        if key not in keys:  # as launch._compiled_resources caches them
            result = counter.compile(kernel, args, constexprs, options, "planning")
            keys[key] = KernelResources(result["registers"], result["shared"], options["num_warps"],
                                        result["spills"])
        return keys[key]

    class StubRecord:
        def __init__(self, kernel, backend_, device, plan, scalars, launches, options, fallback):
            self.plan = plan
            counter.plans.append(f"{kernel.fn.__name__} {plan.regime} {plan.programs} programs, occupancy "
                                 f"{plan.occupancy}, {_short(options)}, {_short(launches[0])}")
            self._launched = [(kernel, scalars, c, options) for c in launches]
            self._done = False

        def compile(self, tensors, why: str = "build"):
            """Compile what a first launch on ``tensors`` runs (``LaunchRecord.compile``: a sliced
            record's build asks for its phases' binaries)."""
            for kernel, scalars, constexprs, options in self._launched:
                name = kernel.fn.__name__
                arity = len(variants.TENSORS["backward" if "backward" in name else "forward"])
                if name.startswith("softmax_") and len(tensors) == arity and "partials" not in name \
                        and "normalize" not in name:
                    tensors = (*tensors, tensors[0], tensors[0])  # as LaunchRecord pads them
                scratch = (torch.int64, torch.int32) if name.endswith("_split") else ()
                args = (*tensors, *scratch, *scalars)
                key = (kernel.fn.__name__, tuple(sorted(constexprs.items())), tuple(sorted(options.items())),
                       launch._specialization(args))
                if key not in keys:
                    keys[key] = KernelResources(0, 0, 1)
                    counter.compile(kernel, args, constexprs, options, why)

        def __call__(self, tensors):
            if not self._done:
                self.compile(tensors, "first launch")
                self._done = True
            return self.plan

    for module in (launch, loss_launch):
        module.backend_for = lambda device: backend
        module.device_record = lambda device: record
        module.LaunchRecord = StubRecord
    launch._compiled_resources = compiled_resources
    loss_launch._compiled_resources = compiled_resources


def _attention() -> None:
    scores = torch.empty(8, 16, 1024, 1024, dtype=torch.bfloat16)
    keep = torch.ones(8, 1, 1, 1024, dtype=torch.bool)
    ps.softmax(scores, -1, scale=0.125, mask=keep)


def _backward() -> None:
    x = torch.empty(4096, 50257, dtype=torch.bfloat16, requires_grad=True)
    ps.softmax(x, -1).backward(torch.empty(4096, 50257, dtype=torch.bfloat16))


def _loss() -> None:
    logits = torch.zeros(4096, 50257, dtype=torch.bfloat16, requires_grad=True)
    ps.cross_entropy(logits, torch.zeros(4096, dtype=torch.int64)).backward()


CASES: dict[str, Callable[[], None]] = {
    "softmax 4096x50257 bf16": lambda: ps.softmax(torch.empty(4096, 50257, dtype=torch.bfloat16), -1),
    "softmax 32x128256 fp32": lambda: ps.softmax(torch.empty(32, 128256), -1),
    "softmax+backward 4096x50257 bf16": _backward,
    "column softmax 32768x1024 bf16 dim 0": lambda: ps.softmax(torch.empty(32768, 1024, dtype=torch.bfloat16), 0),
    "attention 8x16x1024x1024 bf16, mask, scale": _attention,
    "cross_entropy fwd+bwd 4096x50257 bf16": _loss,
}


def _one(name: str, detail: bool) -> None:
    counter = Counter()
    install(counter)
    CASES[name]()
    planning = sum(1 for _, _, why in counter.compiles if why == "planning")
    launched = sum(1 for _, _, why in counter.compiles if why in ("build", "first launch"))
    total = sum(s for _, s, _ in counter.compiles)
    print(f"{name:<44} {len(counter.compiles):>8} {planning:>8} {launched:>6} {total:>8.1f}", flush=True)
    if detail:
        for what, seconds, why in counter.compiles:
            print(f"    {seconds:5.2f} s  {why:<12} {what}", flush=True)
        for plan in counter.plans:
            print(f"    launches: {plan}", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--case", action="append", choices=sorted(CASES))
    parser.add_argument("--detail", action="store_true", help="list each compile")
    parser.add_argument("--one", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        _one(args.one, args.detail)
        return 0
    print(f"torch {torch.__version__}, cross-compiling for sm_90 here; each case in a fresh process, empty cache")
    print(f"{'case':<44} {'compiles':>8} {'planning':>8} {'launch':>6} {'seconds':>8}", flush=True)
    for name in args.case or CASES:
        # A fresh process and Triton cache per case: nothing planned or compiled before it.
        env = {**os.environ, "TRITON_CACHE_DIR": tempfile.mkdtemp(prefix="first-call-cache-")}
        subprocess.run([sys.executable, __file__, "--one", name, *(["--detail"] if args.detail else [])],
                       env=env, check=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
