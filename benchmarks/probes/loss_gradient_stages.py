"""The cross-entropy forward's gradient-writing split variants (every form the compile report
compiles for 8192x128256 and 4096x50257, bf16 and float32) at one and three stages: registers,
spills and shared memory (stage buffers where it pipelines), no GPU needed (issue 32).

    PYTHONPATH=. python benchmarks/probes/loss_gradient_stages.py [--targets cuda:90,hip:gfx942]

Measured on main and on a form without the barrier (NOTES v30): at three stages the stage buffers
appear, and registers grow 13-73 on sm_90; the forms with every option spill.
"""
import argparse
import dataclasses
import json

from portable_softmax.crosscompile.targets import parse_target, target_record
from portable_softmax.crosscompile.cases import Case, loss_configs, variant_spec
from portable_softmax.crosscompile.compiling import compile_all

DTYPES = ("bfloat16", "float32")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--targets", default="cuda:90", help="comma-separated, as `portable-softmax compile` takes them")
    targets = parser.parse_args().targets.split(",")
    shapes = [(8192, 128256), (4096, 50257)]
    specs, labels = [], []
    for t in targets:
        target = parse_target(t)
        record, profile, note = target_record(target)
        for rows, cols in shapes:
            for dtype in DTYPES:
                case = Case(rows, cols, dtype, False, False, loss=True)
                seen = set()
                for role, config in loss_configs(record, case):
                    if config.regime != "split" or not role.startswith("grad"):
                        continue
                    for stages in (1, 3):
                        c = dataclasses.replace(config, num_stages=stages)
                        spec = variant_spec(target, record, c, case, role)
                        key = json.dumps([spec["kernel"], spec["constexprs"], spec["options"]], sort_keys=True, default=str)
                        if key in seen:
                            continue
                        seen.add(key)
                        specs.append(spec)
                        k = spec["constexprs"]
                        labels.append(f"{t} {rows}x{cols} {dtype} {role[:40]:40s} BN={k['BLOCK_N']} AL={k['ALIGN']} TK={k['TICKETED']} ALL={k['SOFTCAP']} S={k['STAGES']} w={spec['options']['num_warps']}")
    results = compile_all(specs, jobs=2, timeout=600)
    for label, r in zip(labels, results):
        if r["status"] != "ok":
            print(label, r["status"], str(r.get("error", ""))[-300:])
            continue
        sgprs = f" sgprs={r['sgprs']}" if "sgprs" in r else ""
        print(label, f"regs={r['registers']} spills={r['spills']} shared={r['shared']}{sgprs}", flush=True)


if __name__ == "__main__":
    main()
