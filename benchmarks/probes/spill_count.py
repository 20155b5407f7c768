"""Which spill count the compile report should give (v21): the driver's (Triton's ``n_spills``,
the local bytes a thread uses / 4, which the launch's register caps read) against cuobjdump's
resource fields (LOCAL, STACK) for the same cubin, at several register caps of the column
softmax's split kernel (a ptxas spill goes to the stack frame).

    python benchmarks/probes/spill_count.py
"""
from __future__ import annotations

import torch

from portable_softmax import crosscompile


def main() -> None:
    major, minor = torch.cuda.get_device_capability()
    target = crosscompile.parse_target(f"cuda:{major}{minor}")
    record, _, _ = crosscompile.target_record(target)
    case = crosscompile.Case(1024, 32768, "float32", False, False, strided=True)
    role, config = next(found for found in crosscompile.planned_configs(record, case) if found[0] == "ticketed")
    print(torch.cuda.get_device_name(), role, config)
    print("| maxnreg | n_regs | n_spills (driver) | cuobjdump REG | STACK | LOCAL |")
    print("|---|---|---|---|---|---|")
    for cap in (None, 128, 96, 80, 64):
        spec = crosscompile.variant_spec(target, record, config, case)
        if cap:
            spec["options"]["maxnreg"] = cap
        compiled, *_ = crosscompile.compiled_variant(spec)
        compiled._init_handles()
        usage = crosscompile.cubin_resources(compiled.asm["cubin"], compiled.metadata.name)
        print(f"| {cap} | {compiled.n_regs} | {compiled.n_spills} | {usage['REG']} | {usage.get('STACK', 0)} | "
              f"{usage.get('LOCAL', 0)} |")


if __name__ == "__main__":
    main()
