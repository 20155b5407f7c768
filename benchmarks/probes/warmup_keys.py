"""The compile keys of ``portable-softmax warmup``'s cross-entropy call against a first
``ps.cross_entropy(logits, target).backward()`` of the same shape (issue 34 item 4), on a machine
without a GPU: a recorded sm_90 chip's record (``--profile``, default h100), launches stubbed as
``first_call_compiles.py`` stubs them. Each variant planning compiles or a first launch would
compile is printed with its constexprs, options and arguments (dtype, 16-byte alignment, ints as
Triton specialises them; shape, strides, offset). ``--real``: planning's compiles are real sm_90
cross-compiles (its resources as on the GPU) into ``TRITON_CACHE_DIR``, else every compile reports
128 registers. Run as ``warmup``, ``warmup_all`` (the softmax call first, as the command makes
them) and ``call``, and diff the outputs; with ``--real`` and one ``TRITON_CACHE_DIR`` for
``warmup_all`` then ``call``, the group files the call adds are what it would compile after the
warmup (Triton's disk keys: NOTES, "Why it compiled").

    PYTHONPATH=. python benchmarks/probes/warmup_keys.py {warmup,warmup_all,call} [--real] [--profile h200]
"""
from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import first_call_compiles as found  # noqa: E402  (sets the environment: no interpreter, an empty cache)

import torch  # noqa: E402

import portable_softmax as ps  # noqa: E402
from portable_softmax import warmup  # noqa: E402


class Keys(found.Counter):
    def __init__(self, real: bool) -> None:
        super().__init__()
        self.real = real
        self.keys: list[dict] = []

    def compile(self, kernel, args, constexprs, options, why):
        self.keys.append({"why": why, "kernel": kernel.fn.__name__, "args": [found._arg(a) for a in args],
                          "tensors": [(str(a.dtype), a.data_ptr() % 16 == 0, tuple(a.shape), a.stride(),
                                       a.storage_offset()) if isinstance(a, torch.Tensor) else repr(a) for a in args],
                          "constexprs": {k: repr(v) for k, v in constexprs.items()}, "options": dict(options)})
        if self.real and why == "planning":
            return super().compile(kernel, args, constexprs, options, why)
        return {"registers": 128, "shared": 0, "spills": 0}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("mode", choices=("warmup", "warmup_all", "call"))
    parser.add_argument("--real", action="store_true")
    parser.add_argument("--profile", default="h100", help="a recorded sm_90 chip (h100, h200)")
    args = parser.parse_args()
    keys = Keys(args.real)
    found.install(keys, args.profile)
    cpu = torch.device("cpu")
    if args.mode == "call":  # as benchmarks/first_call.py's "loss" case
        logits = torch.randn(4096, 50257, dtype=torch.bfloat16, requires_grad=True)
        ps.cross_entropy(logits, torch.randint(0, 50257, (4096,))).backward()
    else:
        calls = warmup.warmup_calls([(4096, 50257)], ["bfloat16"], [-1], log=False, backward=True, loss=True)
        for call in calls if args.mode == "warmup_all" else calls[-1:]:
            warmup.run_call(call, cpu)
    for key in keys.keys:
        print(json.dumps(key))
    return 0


if __name__ == "__main__":
    sys.exit(main())
