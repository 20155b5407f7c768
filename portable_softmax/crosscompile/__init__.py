"""Cross-compiled proof without hardware: compile, on a machine without any GPU, every kernel
variant the launch plans use for a set of GPU targets, and report what each binary occupies.

For each target (``cuda:<compute capability>`` or ``hip:<gfx arch>``) the device record comes from
the recorded profile of that chip (``profiles/*.json``); a target without one gets a *synthetic*
record: the nearest recorded chip's properties with the architecture replaced, and the output says
so. For every problem (shape, dtype, direction, softmax or log_softmax) the planner's
``select_config`` names the kernel configuration the launch would use, and also the one it falls
back to when the split-row path cannot be used (not resident, or no scratch during graph
capture). Each distinct variant is compiled with Triton's own compiler for the target, specialised
as ``kernel[grid](...)`` would specialise a launch on contiguous tensors (16-byte aligned pointers,
column stride 1), with ``num_warps`` / ``num_stages`` from the configuration.

Resource use without a driver: NVIDIA register, stack, shared and local (spill) sizes come from
``cuobjdump --dump-resource-usage`` on the cubin; AMD ones from the code object metadata in the
AMDGCN assembly (``.vgpr_count``, ``.sgpr_count``, ``.vgpr_spill_count``,
``.private_segment_fixed_size``, ``.group_segment_fixed_size``). Those numbers go through the same
``plan_launch`` the device layer uses, giving each problem's occupancy and persistent grid.

Each compile runs in a worker process (spawned, without ``TRITON_INTERPRET``) under a timeout, so
a compile that never ends is reported as a timeout instead of hanging the run.

Modules: ``targets`` (targets, their device records, whether this machine can compile for them),
``cases`` (problems, the variants they use, the launch specialisation), ``compiling`` (the compile
in worker processes), ``checks`` (what a binary holds: resources, wait loops), ``report`` (the run,
its report and the ``compile`` command line).
"""
from portable_softmax.crosscompile.cases import (Case, case_configs, cases_for, launch_arguments, loss_arguments,
                                                 planned_configs, sharded_arguments, variant_spec)
from portable_softmax.crosscompile.checks import (called_shared_memory, cubin_resources, cubin_sass, wait_loop_check,
                                                  wait_source_lines)
from portable_softmax.crosscompile.compiling import compile_all, compile_variant, compiled_variant
from portable_softmax.crosscompile.report import add_arguments, format_report, run, run_command
from portable_softmax.crosscompile.targets import Target, parse_target, target_problem, target_record, toolchain_missing

__all__ = [
    "Case", "Target", "add_arguments", "called_shared_memory", "case_configs", "cases_for", "compile_all",
    "compile_variant", "compiled_variant", "cubin_resources", "cubin_sass", "format_report", "launch_arguments",
    "loss_arguments", "parse_target", "planned_configs", "run", "run_command", "sharded_arguments", "target_problem",
    "target_record", "toolchain_missing", "variant_spec", "wait_loop_check", "wait_source_lines",
]
