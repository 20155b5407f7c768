"""The whole run and its report: every target's variants compiled, their resource use through the
same ``plan_launch`` the device layer uses (each problem's occupancy and persistent grid), the
report's text, and the ``compile`` command line."""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any, Callable, Optional, Sequence

from portable_softmax.backend import get_backend
from portable_softmax.arguments import parse_shape as _shape
from portable_softmax.plan_grid import KernelConfig
from portable_softmax.variants import EXCHANGE_ARRIVE
from portable_softmax.planner import DTYPE_BYTES
from portable_softmax.targets import plan_launch, plan_loss
from portable_softmax.record import DeviceRecord, KernelResources
from portable_softmax.tuning import tuning_for
from portable_softmax.crosscompile.targets import (_TARGET_FORMS, DEFAULT_TARGETS, parse_target, Target, target_problem,
                                                   target_record, toolchain_missing)
from portable_softmax.crosscompile.cases import (_cost, _spec_key, Case, case_configs, cases_for, DEFAULT_DTYPES,
                                                 DEFAULT_FUSED_SHAPES, DEFAULT_LOSS_SHAPES, DEFAULT_SHAPES,
                                                 DEFAULT_SHARDED_SHAPES, LOSS_ALTERNATIVE, loss_form, loss_plan_options,
                                                 DEFAULT_SLICED_SHAPES, DEFAULT_STRIDED_SHAPES, SLICED_PADDING,
                                                 variant_spec)
from portable_softmax.crosscompile.compiling import compile_all, DEFAULT_TIMEOUT_S
from portable_softmax.crosscompile.table import compile_table, spec_key, write_table


def run(targets: Sequence[Target], cases: Sequence[Case], *, jobs: int = 2, timeout: float = DEFAULT_TIMEOUT_S,
        progress: Optional[Callable[[str], None]] = None, table: Optional[str] = None) -> dict[str, Any]:
    """Plan, compile and check every variant; the report as plain data (``report["ok"]``). A
    target whose toolchain is missing here (``toolchain_missing``) is not compiled: its report
    says why (``unavailable``), and is not ok. With ``table`` (a folder), also compile the
    register-capped forms a launch may weigh, and write each target's table of known resources
    there (``crosscompile.table``; ``report["tables"]``: the files written)."""
    started = time.perf_counter()
    specs: list[dict[str, Any]] = []
    index_of: dict[str, int] = {}
    per_target = []
    unavailable: dict[str, str] = {}

    def add(spec: dict[str, Any]) -> int:
        key = _spec_key(spec)
        if key not in index_of:
            index_of[key] = len(specs)
            specs.append(spec)
        return index_of[key]
    for target in targets:
        record, profile, note = target_record(target)
        uses = []
        missing = toolchain_missing(target)
        if missing is not None:
            unavailable[target.name] = missing
            per_target.append((target, record, profile, note, uses))
            continue
        for case in cases:
            for role, config in case_configs(record, case):
                spec = variant_spec(target, record, config, case, role)
                uses.append((case, role, config, add(spec)))
        per_target.append((target, record, profile, note, uses))

    order = sorted(range(len(specs)), key=lambda i: -_cost(specs[i]))  # the long compiles first
    done = [0]

    def report_progress(position: int, result: dict[str, Any]) -> None:
        done[0] += 1
        if progress is not None:
            spec = specs[order[position]]
            c = spec["constexprs"]
            progress(f"[{done[0]}/{len(specs)}] {spec['target'][0]}:{spec['target'][1]} {spec['kernel']} "
                     f"M={c['BLOCK_M']} N={c['BLOCK_N']} warps={spec['options']['num_warps']}: {result['status']}"
                     f" {result.get('compile_s', '')}")

    ordered = compile_all([specs[i] for i in order], jobs=jobs, timeout=timeout, progress=report_progress)
    compiled = [None] * len(specs)
    for position, index in enumerate(order):
        compiled[index] = ordered[position]
    # A loss plan from compiled resources may ask for a form the cases did not list: twice the
    # warps where the listed one spills (``loss_planner._unspilled``), which only a compiled
    # binary shows. Compile what the plans ask, as a first launch would, and plan again.
    for _ in range(ASKED_ROUNDS):
        before = len(specs)
        for (target, record, _, _, uses), asked in zip(per_target, _asked(per_target, specs, compiled)):
            for case, form, config in asked:
                uses.append((case, f"{form}{LOSS_ALTERNATIVE}asked", config,
                             add(variant_spec(target, record, config, case, form))))
        if len(specs) == before:
            break
        compiled += compile_all(specs[before:], jobs=jobs, timeout=timeout)

    report_targets = [_target_report(target, record, profile, note, uses, specs, compiled)
                      for target, record, profile, note, uses in per_target]
    for entry in report_targets:
        if entry["target"] in unavailable:
            entry.update(ok=False, unavailable=unavailable[entry["target"]])
    report = {
        "ok": all(t["ok"] for t in report_targets),
        "elapsed_s": round(time.perf_counter() - started, 1),
        "compiles": len(specs),
        "timeout_s": timeout,
        "targets": report_targets,
    }
    if table is not None:
        import triton

        def report_capped(_: int, result: dict[str, Any]) -> None:
            if progress is not None:
                progress(f"a register-capped form: {result['status']} {result.get('compile_s', '')}")

        report["tables"] = []
        for target, record, _, _, uses in per_target:
            if target.name not in unavailable:
                rows = compile_table(record, [(case, config, specs[i], compiled[i]) for case, _, config, i in uses],
                                     jobs=jobs, timeout=timeout, progress=report_capped)
                report["tables"].append(write_table(table, record, triton.__version__, rows, cases))
    return report


# Rounds of configurations a loss plan asks for beyond the cases' (one suffices: a wider form
# that spills too asks for another).
ASKED_ROUNDS = 2


def _compiled_resources(result: dict[str, Any], config: KernelConfig) -> Optional[KernelResources]:
    """A compiled variant's resources, as a launch reads them; None where it did not compile."""
    if result["status"] != "ok":
        return None
    return KernelResources(registers=result["registers"], shared_memory=result["shared"],
                           num_warps=config.num_warps, spills=result["spills"], sgprs=result.get("sgprs", 0))


def _case_resources(uses: list, compiled: list) -> dict[tuple[Case, str], dict[KernelConfig, KernelResources]]:
    """The compiled resources of each configuration a case may use, as launch.py's resources() gives
    them (a loss case's per form: each form is its own binary)."""
    by_case: dict[tuple[Case, str], dict[KernelConfig, KernelResources]] = {}
    for case, role, config, index in uses:
        found = _compiled_resources(compiled[index], config)
        if found is not None:
            by_case.setdefault((case, loss_form(role) if case.loss else ""), {})[config] = found
    return by_case


def _plan_case(record: DeviceRecord, case: Case, role: str, found: dict[KernelConfig, KernelResources]):
    """The plan of ``case`` from the compiled resources ``found``; KeyError (the configuration) where it
    asks for one not compiled."""
    if case.loss:
        return plan_loss(record, case.rows, case.cols, case.plan_dtype, resources=lambda c: found[c],
                         **loss_plan_options(case, loss_form(role)))
    return plan_launch(record, case.rows, case.cols, case.plan_dtype, backward=case.backward,
                       rows_per_group=case.rows, allow_split=role != "fallback", align=case.align,
                       resources=lambda c: found[c], input_bytes=case.input_bytes, narrow=case.narrow,
                       strided=case.strided, causal=case.causal)


def _asked(per_target: list, specs: list, compiled: list) -> list[list[tuple[Case, str, KernelConfig]]]:
    """Per target, the (case, form, configuration) its loss plans ask for that nothing compiled."""
    asked = []
    for target, record, _, _, uses in per_target:
        found = _case_resources(uses, compiled)
        wanted: dict[tuple[Case, str, KernelConfig], None] = {}
        for case, form in dict.fromkeys((case, loss_form(role)) for case, role, _, _ in uses if case.loss):
            try:
                _plan_case(record, case, form, found.get((case, form), {}))
            except KeyError as missing:
                if isinstance(missing.args[0], KernelConfig):
                    wanted[(case, form, missing.args[0])] = None
        asked.append(list(wanted))
    return asked


def _target_report(target: Target, record: DeviceRecord, profile: str, note: Optional[str], uses: list,
                   specs: list, compiled: list) -> dict[str, Any]:
    backend = get_backend(record.backend)
    tuning = tuning_for(record)
    limit = record.shared_memory_per_unit
    variants: dict[int, dict[str, Any]] = {}
    for case, role, config, index in uses:
        if index in variants:
            continue
        spec, result = specs[index], compiled[index]
        entry: dict[str, Any] = {
            "id": len(variants) + 1, "target": target.name, "kernel": spec["kernel"],
            "constexprs": spec["constexprs"], "num_warps": config.num_warps, "num_stages": config.num_stages,
            "pointer": spec["args"][0][0], "status": result["status"], "problems": [], "notes": [],
            "table_key": spec_key(spec),
        }
        if result["status"] == "ok":
            resources = _compiled_resources(result, config)
            occupancy = backend.occupancy(record, resources)
            # Triton's launcher grants dynamic shared memory up to the per-block limit less the static part.
            shared_total = result["shared"] + result["static_shared"]
            entry.update({k: result[k] for k in ("registers", "spills", "shared", "static_shared", "compile_s",
                                                 "signature", "specialised", "detail", "called_shared")})
            if spec["kernel"].endswith("_split"):
                entry.update({k: result[k] for k in ("wait_loops", "wait_loop_reads", "wait_loop_reads_memory")})
                if spec["constexprs"].get("PHASE") == EXCHANGE_ARRIVE:
                    # By arrival no program waits (``kernels.exchange._arrive``): a wait loop there is a bug.
                    if result["wait_loops"]:
                        entry["problems"].append(f"{result['wait_loops']} wait loops in a kernel that exchanges by "
                                                 f"arrival, where no program may wait")
                elif not result["wait_loop_reads_memory"]:
                    # A variant the planner never launches on this target (HIP plans no split path
                    # yet) is reported, not failed: the report says where the split path would hang.
                    found = (f"a wait loop does not read memory ({result['wait_loops']} wait loops found): a "
                             f"program waiting on an empty slot would spin forever")
                    unplanned = all(role.endswith("unplanned") for _, role, _, i in uses if i == index)
                    (entry["notes"] if unplanned else entry["problems"]).append(found)
            if result["called_shared"]:
                entry["problems"].append(f"called functions use shared memory: {', '.join(result['called_shared'])}")
            entry.update(shared_limit=limit, shared_ok=limit is None or shared_total <= limit, occupancy=occupancy)
            entry["resources"] = resources
            if not entry["shared_ok"]:
                entry["problems"].append(f"shared memory {result['shared']} + static {result['static_shared']} "
                                         f"bytes exceeds the {limit}-byte limit of {target.name}")
            if occupancy < 1:
                entry["problems"].append("occupancy 0: one program does not fit a unit")
        else:
            entry["error"] = result.get("error", "")
            entry["problems"].append(f"{result['status']}: {entry['error'].splitlines()[0] if entry['error'] else ''}")
        variants[index] = entry

    by_case = _case_resources(uses, compiled)

    plans = []
    for case, role, config, index in uses:
        variant = variants[index]
        row = {"case": case.label(), "rows": case.rows, "cols": case.cols, "dtype": case.dtype,
               "direction": case.direction, "log": case.log, "role": role, "variant": variant["id"],
               "regime": config.regime, "block_m": config.block_m, "problems": []}
        plans.append(row)
        compiled_for_case = by_case.get((case, loss_form(role) if case.loss else ""), {})
        if case.sharded and "resources" in variant:
            # Streamed like the loop regime: no program waits on another, so any grid is safe.
            row["note"] = "sharded rows: streamed, no program waits on another"
            continue
        if config not in compiled_for_case:
            row["problems"].append(f"variant {variant['id']} did not compile")
            continue
        try:
            plan = _plan_case(record, case, role, compiled_for_case)
        except KeyError as missing:
            row["problems"].append(f"the plan from compiled resources asks for a configuration not compiled: "
                                   f"{missing}")
            continue
        if plan.config != config:
            # Another configuration serves the case: the ticketed, persistent or unpipelined
            # form, or the fallback where the split grid does not fit resident (each has its
            # own row).
            row["note"] = f"not used: {plan.reason}"
            continue
        resident = record.compute_units * plan.occupancy
        # Persistent split programs wait on each other: the whole grid must be resident at
        # once. Ticketed split, tile and loop programs never wait on one that has not
        # started, so the planner may queue up to tile_waves waves, or give each tile or
        # item a program (None: no bound).
        waves: Optional[int] = 1 if config.regime == "split" else tuning.tile_waves
        one_each = config.regime == "tile" and plan.programs >= plan.items
        if config.per_tile or config.ticketed or config.phased or config.arrival or one_each:
            # (The last: a program per tile, as the loss's tiles of one row plan where
            # that fills the chip best; none waits on another.)
            waves = None
        row.update(programs=plan.programs, occupancy=plan.occupancy, resident_limit=resident,
                   compute_units=record.compute_units, waves=round(plan.programs / max(resident, 1), 2),
                   allowed_waves=waves, reason=plan.reason)
        if waves is not None and plan.programs > resident * waves:
            row["problems"].append(f"{plan.programs} programs exceed {waves} wave(s) of "
                                   f"{record.compute_units} units x occupancy {plan.occupancy}")
        # A ticketed row's chunks wait on each other: they must fit one residency domain.
        domain_units = record.compute_units // record.residency_domains
        if config.ticketed and config.chunks > domain_units * plan.occupancy:
            row["problems"].append(f"rows of {config.chunks} chunks exceed one of {record.residency_domains} "
                                   f"residency domains: {domain_units} units x occupancy {plan.occupancy}")
    # Each loss form is served by one of its compiled configurations.
    for case, form in {(case, loss_form(role)) for case, role, _, _ in uses if case.loss}:
        rows = [row for row in plans if row["case"] == case.label() and loss_form(row["role"]) == form]
        if rows and not any(row["problems"] for row in rows) and all("note" in row for row in rows):
            rows[0]["problems"].append(f"no compiled configuration of the {form!r} form serves it")

    variant_list = sorted(variants.values(), key=lambda v: v["id"])
    for v in variant_list:
        v.pop("resources", None)
    ok = not any(v["problems"] for v in variant_list) and not any(p["problems"] for p in plans)
    return {"target": target.name, "warp_size": target.warp_size, "profile": profile, "synthetic": note,
            "record": record.to_dict(), "ok": ok, "unavailable": None, "variants": variant_list, "plans": plans}


def format_report(report: dict[str, Any]) -> str:
    lines = []
    for t in report["targets"]:
        r = t["record"]
        lines.append(f"== {t['target']} (warp {t['warp_size']}): {r['name']}")
        lines.append(f"   profile {t['profile']}; {r['compute_units']} units in {r['residency_domains']} residency "
                     f"domain(s), {r['registers_per_unit']} registers/unit, shared limit "
                     f"{r['shared_memory_per_unit']} B/program, cooperative launch "
                     f"{'yes' if r['cooperative_launch'] else 'no'}")
        if t["synthetic"]:
            lines.append(f"   NOTE: {t['synthetic']}")
        if t.get("unavailable"):
            lines.append(f"   NOT COMPILED: {t['unavailable']}")
            lines.append(f"   {t['target']}: PROBLEMS")
            lines.append("")
            continue
        lines.append(f"   {'#':>2} {'kernel':<24} {'BLOCK_M':>7} {'BLOCK_N':>7} {'CHUNKS':>6} {'warps':>5} {'ptr':>5} "
                     f"{'regs':>4} {'spill':>5} {'shared':>6} {'static':>6} {'occ':>3} {'compile':>8}  status")
        for v in t["variants"]:
            c = v["constexprs"]
            head = (f"   {v['id']:>2} {v['kernel']:<24} {c['BLOCK_M']:>7} {c['BLOCK_N']:>7} {c.get('CHUNKS', '-'):>6} "
                    f"{v['num_warps']:>5} {v['pointer']:>5} ")
            if v["status"] == "ok":
                notes = [f"spills {v['spills'] * 4} B to memory"] if v["spills"] else []
                if v["detail"].get("agpr_count"):
                    notes.append(f"{v['detail']['agpr_count']} AGPRs")
                if v["detail"].get("sgpr_spill_count"):
                    notes.append(f"{v['detail']['sgpr_spill_count']} SGPRs spilled to VGPR lanes")
                status = "ok" + (f" ({', '.join(notes)})" if notes else "")
                status = "; ".join(v["problems"]) if v["problems"] else status
                if v.get("notes"):
                    status += f" (not planned here: {'; '.join(v['notes'])})"
                lines.append(head + f"{v['registers']:>4} {v['spills']:>5} {v['shared']:>6} {v['static_shared']:>6} "
                                    f"{v['occupancy']:>3} {v['compile_s']:>7.1f}s  {status}")
            else:
                why = " | ".join(line.strip() for line in v.get("error", "").splitlines()[:2])
                lines.append(head + f"{'':>37}  {v['status'].upper()}: {why}")
        lines.append(f"   {'problem':<44} {'role':<8} {'#':>2} {'regime':<6} {'occ':>3} {'programs':>8} "
                     f"{'units x occ':>11} {'waves':>5}")
        for p in t["plans"]:
            if "programs" in p:
                tail = f"{p['occupancy']:>3} {p['programs']:>8} {p['resident_limit']:>11} {p['waves']:>5}"
            elif p.get("note"):
                tail = f"{'':>3} {'':>8} {'':>11} {'':>5}  ({p['note']})"
            else:
                tail = "  not planned"
            if p["problems"]:
                tail += "  " + "; ".join(p["problems"])
            lines.append(f"   {p['case']:<44} {p['role']:<8} {p['variant']:>2} {p['regime']:<6} {tail}")
        lines.append(f"   {t['target']}: {'OK' if t['ok'] else 'PROBLEMS'}")
        lines.append("")
    failed = [t["target"] for t in report["targets"] if not t["ok"]]
    verdict = f"problems on {', '.join(failed)}" if failed else "all variants compiled and fit their targets"
    lines.append(f"{report['compiles']} compiles in {report['elapsed_s']} s: {verdict}")
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--target", type=_target, action="append",
                        help=f"{_TARGET_FORMS}, optionally =PROFILE to pick the recorded chip; repeat for "
                             f"several (default: {' '.join(DEFAULT_TARGETS)})")
    parser.add_argument("--shape", type=_shape, action="append",
                        help="rows x columns; repeat for several (default: "
                             f"{' '.join(f'{r}x{c}' for r, c in DEFAULT_SHAPES)})")
    parser.add_argument("--strided-shape", type=_shape, action="append",
                        help="rows x length of a reduction along a strided dimension (a softmax over dim 0 "
                             "of a contiguous length x rows tensor); repeat for several (default: "
                             f"{' '.join(f'{r}x{c}' for r, c in DEFAULT_STRIDED_SHAPES)}, unless --shape is given)")
    parser.add_argument("--sharded-shape", type=_shape, action="append",
                        help="rows x a rank's slice of rows sharded across ranks; repeat for several (default: "
                             f"{' '.join(f'{r}x{c}' for r, c in DEFAULT_SHARDED_SHAPES)}, unless --shape is given)")
    parser.add_argument("--fused-shape", type=_shape, action="append",
                        help="rows x keys of the fused variants (a scale tensor, a bool mask, causal); repeat for "
                             f"several (default: {' '.join(f'{r}x{c}' for r, c in DEFAULT_FUSED_SHAPES)}, unless "
                             "--shape is given)")
    parser.add_argument("--sliced-shape", type=_shape, action="append",
                        help=f"rows x length of rows sliced from a vocabulary padded to {SLICED_PADDING}, written "
                             "contiguous (unaligned); repeat for several (default: "
                             f"{' '.join(f'{r}x{c}' for r, c in DEFAULT_SLICED_SHAPES)}, unless --shape is given)")
    parser.add_argument("--loss-shape", type=_shape, action="append",
                        help="tokens x vocabulary of the cross-entropy kernels; repeat for several (default: "
                             f"{' '.join(f'{r}x{c}' for r, c in DEFAULT_LOSS_SHAPES)}, unless --shape is given)")
    parser.add_argument("--dtype", action="append", choices=sorted(DTYPE_BYTES),
                        help=f"repeat for several (default: {' '.join(DEFAULT_DTYPES)})")
    parser.add_argument("--log", action="store_true", help="also compile the log_softmax (LOG=True) variants")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, help="seconds allowed per compile")
    parser.add_argument("--jobs", type=int, default=max(1, min(os.cpu_count() or 1, 8)),
                        help="compiles at once (default: CPU count, at most 8)")
    parser.add_argument("--table", metavar="FOLDER",
                        help="also compile the register-capped forms a launch may weigh, and write each target's table "
                             "of known resources (<backend>-<arch>-triton-<version>.json) into FOLDER, over the rows "
                             "already there; the package's own: portable_softmax/kernel_resources")
    parser.add_argument("--json", action="store_true")


def run_command(args: argparse.Namespace) -> int:
    """``portable-softmax compile``: 0 when every variant compiled and fits its target, else 1."""
    targets = args.target or [parse_target(t) for t in DEFAULT_TARGETS]
    logs = (False, True) if args.log else (False,)
    strided = args.strided_shape or (() if args.shape else DEFAULT_STRIDED_SHAPES)
    sharded = args.sharded_shape or (() if args.shape else DEFAULT_SHARDED_SHAPES)
    fused = args.fused_shape or (() if args.shape else DEFAULT_FUSED_SHAPES)
    sliced = args.sliced_shape or (() if args.shape else DEFAULT_SLICED_SHAPES)
    loss = args.loss_shape or (() if args.shape else DEFAULT_LOSS_SHAPES)
    cases = cases_for(args.shape or DEFAULT_SHAPES, args.dtype or DEFAULT_DTYPES, logs, strided, sharded, fused,
                      sliced, loss)
    show = getattr(args, "verbose", False) or sys.stderr.isatty()
    report = run(targets, cases, jobs=max(1, args.jobs), timeout=args.timeout,
                 progress=(lambda line: print(line, file=sys.stderr, flush=True)) if show else None, table=args.table)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(format_report(report))
        for path in report.get("tables", []):
            print(f"wrote the known resources of the compiled variants to {path}")
    return 0 if report["ok"] else 1


def _target(text: str) -> Target:
    try:
        target = parse_target(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    # Refused here, not after a run of compiles that each die (cuda:999 aborted every one).
    problem = target_problem(target)
    if problem is not None:
        raise argparse.ArgumentTypeError(f"target {text!r}: {problem}")
    return target
