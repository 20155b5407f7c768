"""Bugs made on purpose: which of them the tests see.

Each mutant is one small edit of the library (a snippet that must occur exactly once in its file,
and what replaces it) and the tests that must fail with it in place, each comparing with torch,
never with the package's own other path. For every mutant the script applies the edit to a copy
of this checkout (its tracked and untracked, not ignored, files as they are now), runs the tests
in that copy and records whether they failed (killed) or passed (survived). A mutant known to
survive says why in ``expected_survivor``; it is run and reported like the others.

    python ci/mutants.py                    # every mutant; the table on stdout
    python ci/mutants.py --list             # the mutants and their tests, nothing run
    python ci/mutants.py -m max_shift_flipped -m backward_term_dropped

Exit status: 0 when every mutant is killed except the expected survivors, which survive; 1 when a
mutant survives unexpectedly or an expected survivor is killed (its mark is stale: remove it); 2
when the script cannot judge: a snippet not found exactly once (the code moved: update the
mutant), a selection pytest cannot run, or tests that fail without any mutant.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional

ROOT = Path(__file__).resolve().parent.parent
# The kernel package: its files hold the math of a concern each (rows, split, fused, common).
KERNELS = "portable_softmax/kernels"


@dataclasses.dataclass(frozen=True)
class Mutant:
    """A bug made on purpose: ``original`` (exactly once in ``path``) becomes ``replacement``, and
    one of ``tests`` (pytest node ids, run in the copy) must then fail."""

    name: str
    path: str
    original: str
    replacement: str
    tests: tuple[str, ...]
    expected_survivor: str = ""


def _ids(function: str, *params: str) -> tuple[str, ...]:
    """Node ids of ``function`` (``file::name``) with each of ``params`` (its id in brackets)."""
    return tuple(f"{function}[{param}]" for param in params)


FORWARD = "tests/test_softmax.py::test_forward_matches_torch"
FUSED = "tests/test_fused.py::test_fused_variants_match_the_composite"
SPLIT_LOSS = "tests/test_loss.py::test_split_rows_match_torch"

MUTANTS = [
    # The four that passed the whole suite in issue 35.
    Mutant("split_chunks_own_maximum", f"{KERNELS}/split.py",
           "            scale = tl.exp2((chunk_max - row_max) * LOG2E) / row_total\n"
           "            shift = chunk_max - row_max - tl.log(row_total)\n",
           "            scale = tl.exp2((chunk_max - chunk_max) * LOG2E) / row_total\n"
           "            shift = chunk_max - chunk_max - tl.log(row_total)\n",
           _ids("tests/test_softmax.py::test_every_regime_writes_every_element",
                "cpu-1000-softmax-split", "cpu-1000-log_softmax-split", "cpu-1000-softmax-ticketed")
           + _ids("tests/test_softmax.py::test_split_rows_with_a_chunk_of_only_minus_inf",
                  "cpu-split-softmax-torch.float32")),
    Mutant("empty_input_drops_dtype", "portable_softmax/op_calls.py",
           "    if x.numel() == 0:\n        return lambda x: _output(x, out_dtype)\n",
           "    if x.numel() == 0:\n        return lambda x: _output(x, x.dtype)\n",
           _ids("tests/test_softmax.py::test_empty_inputs_take_the_dtype_argument",
                "cpu-torch.float32-torch.float64-softmax", "cpu-torch.int64-torch.float32-log_softmax")),
    Mutant("rank_zero_drops_dtype", "portable_softmax/op_calls.py",
           "        return lambda x: _forward(x.reshape(1), 0, out_dtype, log).reshape(())\n",
           "        return lambda x: _forward(x.reshape(1), 0, None, log).reshape(())\n",
           _ids("tests/test_softmax.py::test_rank_zero_inputs_take_the_dtype_argument",
                "cpu-torch.float32-torch.float64-softmax", "cpu-torch.float64-torch.float16-log_softmax")),
    Mutant("looping_grid_loses_waves", "portable_softmax/plan_grid.py",
           "max(1, record.compute_units * max(occupancy, 1) * tuning.tile_waves)",
           "max(1, record.compute_units * max(occupancy, 1))",
           ("tests/test_device_layer.py::test_looping_grids_hold_waves_of_resident_programs",)),
    # Bugs the suite caught in issue 35, and their kind.
    Mutant("max_shift_flipped", f"{KERNELS}/rows.py",
           "    row_max = tl.max(x, 1)\n    z = x - row_max[:, None]\n",
           "    row_max = tl.max(x, 1)\n    z = x + row_max[:, None]\n",
           _ids(FORWARD, "cpu-softmax-torch.float32-1823x781", "cpu-log_softmax-torch.bfloat16-17x16")),
    Mutant("log_softmax_shift_sign", f"{KERNELS}/rows.py",
           "    out = _normalized(z, e, (1.0 / total)[:, None], -tl.log(total)[:, None], LOG)\n",
           "    out = _normalized(z, e, (1.0 / total)[:, None], tl.log(total)[:, None], LOG)\n",
           _ids(FORWARD, "cpu-log_softmax-torch.float32-17x16")),
    Mutant("online_rescale_dropped", f"{KERNELS}/rows.py",
           "            total = total * tl.exp2((row_max - new_ref) * LOG2E) + tl.sum(",
           "            total = total + tl.sum(",
           _ids("tests/test_softmax.py::test_rows_far_below_zero_in_every_regime", "cpu-softmax-loop")),
    # The streamed rows in lane rows (v36: blocks of 1024 columns or more, as the interpreter's
    # 16384 and the test's 4096).
    Mutant("lane_rescale_dropped", f"{KERNELS}/common.py",
           "    lane_sum = lane_sum * tl.exp2((lane_max - ref) * LOG2E) + tl.sum(",
           "    lane_sum = lane_sum + tl.sum(",
           _ids(FORWARD, "cpu-softmax-torch.float32-2x70000")
           + _ids("tests/test_fused.py::test_streamed_rows_reduced_in_lane_rows", "cpu-softmax-bf16-5000")),
    # A streamed row's scale alone goes without the select only where nothing reduces the block
    # (kernels/fused.py's _fused_load_rows): in the statistics pass a negative scale turns the
    # padding's -inf into +inf.
    Mutant("streamed_padding_scaled", f"{KERNELS}/fused.py",
           "    if REDUCED or (MASK != 0 or CAUSAL):\n",
           "    if MASK != 0 or CAUSAL:\n",
           _ids("tests/test_fused.py::test_streamed_rows_reduced_in_lane_rows", "cpu-softmax-bf16-no-mask-2100",
                "cpu-log_softmax-bf16-no-mask-5000")),
    # The softmax's lane reference (kernels/common.py's _finite_floor): a lane of -inf only takes
    # a finite reference; 0 in its place moves every lane of values far below zero.
    Mutant("lane_floor_zero", f"{KERNELS}/common.py",
           "    return tl.maximum(v, floor)\n",
           "    return tl.maximum(v, 0.0)\n",
           _ids("tests/test_fused.py::test_streamed_rows_reduced_in_lane_rows", "cpu-softmax-fp32-5000")),
    # The loss's form of the same step (its one-FFMA exponentials).
    Mutant("loss_lane_rescale_dropped", f"{KERNELS}/common.py",
           "    lane_sum = lane_sum * tl.exp2(lane_max * LOG2E - scaled_ref) + tl.sum(",
           "    lane_sum = lane_sum + tl.sum(",
           _ids("tests/test_loss.py::test_streamed_blocks_reduced_in_lane_rows", "cpu-4096-class-5000",
                "cpu-4096-prob-5000", "cpu-8192-class-5000", "cpu-8192-prob-5000")),
    Mutant("backward_term_dropped", f"{KERNELS}/common.py",
           "    return y * (dy - row_sum)\n",
           "    return y * dy\n",
           _ids("tests/test_softmax.py::test_backward_matches_torch", "cpu-torch.float32--1-softmax")),
    Mutant("double_backward_term_dropped", "portable_softmax/op_autograd.py",
           "        dx = dy - torch.exp(y) * dy.sum(dim, keepdim=True)\n",
           "        dx = dy\n",
           _ids("tests/test_softmax.py::test_differentiable_gradients_match_torch", "cpu-log_softmax")),
    Mutant("bool_mask_ignored", f"{KERNELS}/fused.py",
           "        bias = tl.where(kept, bias, -float(\"inf\"))\n",
           "        bias = bias\n",
           _ids(FUSED, "cpu-bool_mask-softmax-torch.float32-tile")),
    Mutant("scale_ignored", f"{KERNELS}/fused.py",
           "        scale = scale * scale_value\n",
           "        scale = scale\n",
           _ids(FUSED, "cpu-scale-softmax-torch.float32-tile")),
    Mutant("causal_diagonal_masked", f"{KERNELS}/fused.py",
           "        bias = tl.where(cols > q[:, None], -float(\"inf\"), bias)\n",
           "        bias = tl.where(cols >= q[:, None], -float(\"inf\"), bias)\n",
           _ids(FUSED, "cpu-causal-softmax-torch.float32-tile")),
    Mutant("compiled_fused_call_drops_mask", "portable_softmax/fused.py",
           "        return _fused_op(x, dim, out_dtype, log, tensor, value, mask, causal)\n",
           "        return _fused_op(x, dim, out_dtype, log, tensor, value, None, causal)\n",
           _ids("tests/test_torch_compile.py::test_compiled_fused_calls_match_torch_with_gradients", "cpu-eager")),
    Mutant("all_reduce_skipped", "portable_softmax/distributed.py",
           "    dist.all_reduce(sums, group=group)\n",
           "    sums = sums  # the all_reduce skipped\n",
           _ids("tests/test_distributed.py::test_sharded_rows_match_torch", "2")),
    Mutant("all_gather_skipped", "portable_softmax/distributed.py",
           "    _all_gather(gathered, partials, group=group)\n",
           "    gathered = partials.repeat(ranks, 1)  # every rank's partials taken to be this one's\n",
           _ids("tests/test_distributed.py::test_sharded_rows_match_torch", "3")),
    Mutant("vocab_sums_not_reduced", "portable_softmax/distributed_loss.py",
           "        dist.all_reduce(summed, group=group)\n",
           "        summed = summed  # the all_reduce skipped\n",
           _ids("tests/test_distributed_loss.py::test_the_loss_of_the_whole_on_every_rank", "cpu-2")),
    Mutant("vocab_target_column_left", "portable_softmax/distributed_loss.py",
           "    grad.put_(flat, torch.where(saved.held, value.to(grad.dtype), current))",
           "    grad.take(flat).copy_(torch.where(saved.held, value.to(grad.dtype), current))",
           _ids("tests/test_distributed_loss.py::test_the_loss_of_the_whole_on_every_rank", "cpu-3")),
    # The slices' lse merged against 0 where the row's maximum is +inf (as torch's logsumexp): against
    # +inf a row holding +inf has lse NaN.
    Mutant("vocab_reference_of_plus_inf_kept", "portable_softmax/distributed_loss.py",
           "    reference = torch.nan_to_num(row_max, nan=math.nan, posinf=0.0, neginf=0.0)\n",
           "    reference = torch.nan_to_num(row_max, nan=math.nan, posinf=math.inf, neginf=0.0)\n",
           _ids("tests/test_distributed_loss.py::test_rows_holding_infinities_are_torchs", "cpu-2")),
    # z_t NaN where the row's maximum is +inf: without it such a counted row's loss is +inf and its
    # target's column of the gradient finite, where torch's are NaN.
    Mutant("vocab_target_logit_of_plus_inf_row_kept", "portable_softmax/distributed_loss.py",
           "    z_t = parts[1].addcmul_(row_max, zero)\n",
           "    z_t = parts[1]\n",
           _ids("tests/test_distributed_loss.py::test_rows_holding_infinities_are_torchs", "cpu-3")),
    Mutant("head_hidden_gradient_not_summed", "portable_softmax/distributed_head.py",
           "    if grads is not None and grads.hidden is not None:\n        dist.all_reduce(grads.hidden, group=group)\n",
           "    if grads is not None and grads.hidden is not None:\n        pass  # the all_reduce skipped\n",
           _ids("tests/test_distributed_loss.py::test_the_tensor_parallel_head", "cpu-2")),
    Mutant("eager_calls_through_the_operators", "portable_softmax/ops.py",
           "    if _custom_op_call is not None and _compiling():\n",
           "    if _custom_op_call is not None:\n",
           ("tests/test_torch_compile.py::test_eager_calls_do_not_go_through_the_operators",)),
    Mutant("strided_inputs_copied", "portable_softmax/op_calls.py",
           "    view = row_view(tuple(x.shape), dim, x, template)\n",
           "    view = row_view(tuple(x.shape), dim, x, template) if x.is_contiguous() else None\n",
           _ids("tests/test_layout.py::test_common_layouts_need_no_copy",
                "cpu-softmax-transposed-dims0", "cpu-log_softmax-stepped-dims4")),
    Mutant("split_cutoff_dropped", "portable_softmax/split_planner.py",
           ' and n_cols < SPLIT_COLS_LIMIT\n',
           "\n",
           ("tests/test_device_layer.py::test_rows_of_2_31_elements_are_planned_without_the_tensor",)),
    Mutant("strided_row_limit_dropped", "portable_softmax/row_layout.py",
           "    if widest != 1 and (n_cols - 1) * widest >= _MAX_COLUMN_SPAN:\n",
           "    if False:\n",
           ("tests/test_device_layer.py::test_rows_of_2_31_elements_are_planned_without_the_tensor",)),
    # The loss's split rows (kernels/loss_split.py): each chunk's gradient and its share of the loss.
    Mutant("split_loss_chunk_own_maximum", f"{KERNELS}/loss_split.py",
           "scale = tl.exp2((tl.where(chunk_max == -float(\"inf\"), row_max, chunk_max) - lse) * LOG2E)\n",
           "scale = tl.exp2((tl.where(chunk_max == -float(\"inf\"), row_max, chunk_max) - chunk_max\n"
           "                                 - tl.log(row_total)) * LOG2E)\n",
           _ids(SPLIT_LOSS, "cpu-every-option-mean", "cpu-bf16-50257-windows")),
    Mutant("split_loss_smoothing_shares_dropped", f"{KERNELS}/loss_split.py",
           "            ce = tl.where(owns, ce, -smoothing / n_cols * smooth_sum)\n",
           "            ce = tl.where(owns, ce, 0.0)\n",
           _ids(SPLIT_LOSS, "cpu-every-option-mean", "cpu-bf16-50257-windows")),
    Mutant("split_loss_target_column_not_rewritten", f"{KERNELS}/loss_split.py",
           "    tl.store(ptr + at, value, mask=holds)\n",
           "    tl.store(ptr + at, value, mask=holds & False)\n",
           _ids(SPLIT_LOSS, "cpu-every-option-mean", "cpu-bf16-50257-windows")),
    # A program whose chunk lies inside every row runs the loop with no column mask: taken by every
    # program, the rows' last chunks read past their row (the next row's logits, or padding).
    Mutant("split_loss_every_chunk_whole", f"{KERNELS}/loss_split.py",
           "        whole = ((first % CHUNKS + 1) * BLOCK_N <= n_cols) & grouped\n",
           "        whole = grouped\n",
           _ids("tests/test_loss.py::test_split_rows_whose_programs_hold_whole_chunks", "cpu-split", "cpu-pipelined")),
    # The chunks a group of programs takes, rotated by the group's number: rotated by a program's
    # own number instead, two programs of a group take the same chunk and one chunk no program.
    Mutant("split_loss_rotation_not_a_permutation", f"{KERNELS}/loss_split.py",
           "first // CHUNKS * CHUNKS + (first + first // CHUNKS) % CHUNKS",
           "first // CHUNKS * CHUNKS + (first + first // 2) % CHUNKS",
           _ids("tests/test_loss.py::test_split_rows_whose_programs_hold_whole_chunks", "cpu-split", "cpu-pipelined")),
    # A row's exchange slots packed CHUNKS apart again (here 3 of rows of 3 chunks): rows share lines.
    Mutant("exchange_rows_packed", f"{KERNELS}/exchange.py",
           "    return slot_ptr + row * CHUNKS_P2\n",
           "    return slot_ptr + row * (CHUNKS_P2 - 1)\n",
           _ids("tests/test_loss.py::test_split_rows_exchange_slots_lie_a_power_of_two_apart", "cpu")),
    # An ignored row's zeros, selected after its one coefficient: without the select the row's
    # gradient is that coefficient times its exponentials (the z-loss's term, NaN for a +inf logit).
    Mutant("loss_ignored_row_not_zeroed", f"{KERNELS}/loss_terms.py",
           "        g = tl.where(ignored[:, None], 0.0, g)\n",
           "        g = g\n",
           _ids("tests/test_loss.py::test_ignored_rows_of_infinite_logits_have_a_zero_gradient", "cpu-split-fp32",
                "cpu-pipelined-fp32", "cpu-tile-fp32") + _ids(SPLIT_LOSS, "cpu-every-option-mean")),
    # A 16-bit split gradient stores an ignored row's zeros apart (loss_split._write_gradient): without
    # that store its columns keep whatever the buffer held.
    Mutant("split_loss_ignored_zeros_not_stored", f"{KERNELS}/loss_split.py",
           "mask & zeroed[:, None], zeros,",
           "mask & zeroed[:, None] & False, zeros,",
           _ids("tests/test_loss.py::test_ignored_rows_of_infinite_logits_have_a_zero_gradient", "cpu-split-bf16",
                "cpu-pipelined-bf16")),
    # The exchange by arrival (kernels/exchange.py's _arrive): the row's last chunk resets its counter,
    # else the next launch counts on from CHUNKS and no chunk is last (its loss and lse unwritten).
    Mutant("arrival_counter_not_reset", f"{KERNELS}/exchange.py",
           "    tl.store(counter, 0, mask=last)\n",
           "    tl.store(counter, 0, mask=last & False)\n",
           ("tests/test_loss.py::test_split_rows_logsumexp[cpu-arrival]",
            "tests/test_loss.py::test_split_rows_by_arrival_every_option_twice[cpu]")),
    # The loss's streamed forward alone through aligned windows: its edge elements left out of
    # the row's maximum and sum, and out of the smoothing's sum.
    Mutant("loss_loop_edges_dropped", f"{KERNELS}/loss.py",
           "            total = total * tl.exp2(row_max * LOG2E - scaled_ref) + tl.sum(\n"
           "                tl.exp2(z_edge * LOG2E - tl.sum(scaled_ref, 0)), 0)\n"
           "            row_max = high\n",
           "            total = total * 1.0\n",
           _ids("tests/test_loss.py::test_streamed_forward_alone_reads_aligned_windows", "cpu-bf16-odd-stride-plain",
                "cpu-bf16-sliced-plain")),
    Mutant("loss_loop_edge_smoothing_dropped", f"{KERNELS}/loss.py",
           "                smooth_sum += tl.sum(w_edge * tl.where(edge_mask, z_edge, 0.0), 0)\n",
           "                smooth_sum += 0.0\n",
           _ids("tests/test_loss.py::test_streamed_forward_alone_reads_aligned_windows",
                "cpu-fp32-odd-stride-every-option", "cpu-fp32-sliced-every-option")),
    # The stats of a 'mean' of class targets in one launch (kernels/loss.py's cross_entropy_stats):
    # ignored targets counted, the summed weights left for the count, W left for the count, the
    # targets past the first block dropped.
    # (Ignored targets counted: in the stats and in the forward alone's counted sum, which share
    # kernels/loss.py's _counted_targets.)
    Mutant("ignored_targets_counted", f"{KERNELS}/loss.py",
           "    return target, mask & (target != ignore_index)\n",
           "    return target, mask\n",
           _ids("tests/test_loss.py::test_matches_torch", "cpu-mean-weight-smoothing-ignored-zloss")
           + _ids("tests/test_loss_stats.py::test_the_forward_alone_of_a_counted_mean_divides_in_the_sum",
                  "plain-int64", "every-option-uint8")
           + _ids("tests/test_loss_stats.py::test_counted_mean_up_to_a_block_and_beyond", "fp32")),
    Mutant("stats_weights_not_summed", f"{KERNELS}/loss.py",
           "        ce_denominator = tl.sum(summed, 0)\n",
           "        ce_denominator = counted_sum\n",
           _ids("tests/test_loss.py::test_matches_torch", "cpu-mean-weight-smoothing-ignored-zloss")),
    Mutant("stats_class_weights_not_summed", f"{KERNELS}/loss.py",
           "        weight_sum = tl.sum(totals, 0)\n",
           "        weight_sum = counted_sum\n",
           _ids("tests/test_loss.py::test_matches_torch", "cpu-mean-weight-smoothing-ignored-zloss")),
    Mutant("stats_first_block_alone", f"{KERNELS}/loss.py",
           "    for start in tl.range(0, n_targets, BLOCK):\n",
           "    for start in tl.range(0, BLOCK, BLOCK):\n",
           _ids("tests/test_loss_stats.py::test_losses_over_several_blocks_of_targets_or_classes", "counted-targets",
                "weighted-targets")),
    Mutant("stats_first_block_of_classes_alone", f"{KERNELS}/loss.py",
           "        for start in tl.range(0, n_classes, BLOCK):\n",
           "        for start in tl.range(0, BLOCK, BLOCK):\n",
           _ids("tests/test_loss_stats.py::test_losses_over_several_blocks_of_targets_or_classes",
                "weighted-classes")),
    # The reduced loss summed by one launch (kernels/loss.py's cross_entropy_sum): its last term
    # dropped.
    Mutant("sum_last_term_dropped", f"{KERNELS}/loss.py",
           "    total = tl.sum(_wide(tl.load(terms_ptr + where, mask=where < n_terms, other=0.0), ACC_FP64), 0)\n",
           "    total = tl.sum(_wide(tl.load(terms_ptr + where, mask=where < n_terms - 1, other=0.0), ACC_FP64), 0)\n",
           _ids("tests/test_loss_stats.py::test_reduced_loss_is_one_launch_up_to_a_block_and_rounds_once", "bf16",
                "fp32", "fp64")),
    # A loss row's (or lane's, or chunk's) exponentials against 0 where its maximum is +inf too
    # (kernels/common.py's _lse_reference), as torch's logsumexp: against +inf its lse is NaN.
    Mutant("loss_reference_of_plus_inf_kept", f"{KERNELS}/common.py",
           "    return tl.where(tl.abs(v) == float(\"inf\"), 0.0, v)\n",
           "    return tl.where(v == -float(\"inf\"), 0.0, v)\n",
           _ids("tests/test_loss.py::test_lse_of_rows_holding_infinities_is_torchs", "cpu-tile", "cpu-loop",
                "cpu-split")
           + _ids("tests/test_loss.py::test_streamed_forward_alone_reads_aligned_windows", "cpu-fp32-odd-stride-plain")),
    # The loss's lanes likewise (kernels/common.py's _vector_update, written apart: see there).
    Mutant("loss_lane_reference_of_plus_inf_kept", f"{KERNELS}/common.py",
           "    ref = tl.where((high == -float(\"inf\")) | (high == float(\"inf\")), 0.0, high)\n",
           "    ref = tl.where(high == -float(\"inf\"), 0.0, high)\n",
           _ids("tests/test_loss.py::test_lse_of_rows_holding_infinities_is_torchs", "cpu-loop")),
    # The split loss's exchange rescales its chunks' sums to 0 where the row's maximum is +inf.
    Mutant("loss_exchange_plus_inf_reference_dropped", f"{KERNELS}/exchange.py",
           "        if MAXIMA == MAXIMA_LSE:\n",
           "        if MAXIMA == 7:\n",
           _ids("tests/test_loss.py::test_lse_of_rows_holding_infinities_is_torchs", "cpu-split", "cpu-arrival")),
    # A counted row with lse +inf: its gradient NaN throughout, as torch's, not 0 but at the +inf.
    Mutant("loss_gradient_of_plus_inf_row_not_nan", f"{KERNELS}/loss_terms.py",
           "    a = tl.where(ignored | (valid & (lse != float(\"inf\"))), a, float(\"nan\")) * e_scale\n",
           "    a = tl.where(valid | ignored, a, float(\"nan\")) * e_scale\n",
           _ids("tests/test_loss.py::test_lse_of_rows_holding_infinities_is_torchs", "cpu-tile", "cpu-loop",
                "cpu-split")),
    Mutant("interpreter_truncates_bfloat16", "portable_softmax/interpreter.py",
           "        if dst_type.scalar == _tl.bfloat16 and src.dtype.scalar in (_tl.float32, _tl.float64):\n",
           "        if dst_type.scalar == _tl.bfloat16 and src.dtype.scalar == _tl.float64:\n",
           _ids("tests/test_softmax.py::test_bfloat16_results_round_to_nearest_as_torch_s", "cpu-softmax",
                "cpu-log_softmax")),
    # A split forward launched to overlap the stats kernel reading the stats before its wait: the
    # previous call's, where a GPU starts it early (kernels/dependency.py). Seen in its sm_90 PTX.
    Mutant("overlapped_split_reads_before_its_wait", f"{KERNELS}/loss_split.py",
           "    _overlapped(DEPENDENT)\n    ce_scale, z_scale, weight_sum, smoothing, z_loss, softcap = "
           "_constants(stats_ptr, False)\n",
           "    ce_scale, z_scale, weight_sum, smoothing, z_loss, softcap = _constants(stats_ptr, False)\n"
           "    _overlapped(DEPENDENT)\n",
           ("tests/test_crosscompile.py::test_overlapping_kernels_wait_before_touching_memory",)),
    # The split grid's own count of a 'mean''s targets (kernels/grid_count.py): a slice's last
    # position left out, a program without items departing, the word never reset for the next launch.
    Mutant("grid_count_drops_a_slice_end", f"{KERNELS}/grid_count.py",
           "            _, counted = _counted_targets(target_ptr, where, rows < high, ignore_index)\n",
           "            _, counted = _counted_targets(target_ptr, where, rows < high - 1, ignore_index)\n",
           _ids("tests/test_loss.py::test_split_rows_count_their_targets_and_sum_their_loss", "cpu-split", "cpu-one-program")),
    Mutant("grid_count_departs_without_items", f"{KERNELS}/grid_count.py",
           "    last = takes & (tl.atomic_add(departures, 1, mask=takes, sem=\"acq_rel\") == participants - 1)\n",
           "    last = tl.atomic_add(departures, 1, sem=\"acq_rel\") == participants - 1\n",
           _ids("tests/test_loss.py::test_split_rows_count_their_targets_and_sum_their_loss", "cpu-wider-than-its-items")),
    Mutant("grid_count_never_reset", f"{KERNELS}/grid_count.py",
           "    tl.store(word, 0, mask=last)\n",
           "    tl.store(word, 0, mask=last & (n_items < 0))\n",
           _ids("tests/test_loss.py::test_split_rows_count_their_targets_and_sum_their_loss", "cpu-split", "cpu-pipelined")),
    # The split grid's own sum of a reduced loss (kernels/grid_sum.py): the last program reading
    # the first block of partials only, a program without items counting its finish, the finish
    # counter never reset for the next launch.
    Mutant("grid_sum_first_block_only", f"{KERNELS}/grid_sum.py",
           "        for start in tl.range(0, participants, SUM_BLOCK):\n",
           "        for start in tl.range(0, tl.minimum(participants, SUM_BLOCK), SUM_BLOCK):\n",
           _ids("tests/test_loss.py::test_split_rows_count_their_targets_and_sum_their_loss", "cpu-partials-in-blocks")),
    Mutant("grid_sum_finishes_without_items", f"{KERNELS}/grid_sum.py",
           "    last = takes & (tl.atomic_add(finish, 1, mask=takes, sem=\"acq_rel\") == participants - 1)\n",
           "    last = tl.atomic_add(finish, 1, sem=\"acq_rel\") == participants - 1\n",
           _ids("tests/test_loss.py::test_split_rows_count_their_targets_and_sum_their_loss", "cpu-wider-than-its-items")),
    Mutant("grid_sum_never_reset", f"{KERNELS}/grid_sum.py",
           "        tl.store(finish, 0)\n",
           "        tl.store(finish, 0, mask=n_items < 0)\n",
           _ids("tests/test_loss.py::test_split_rows_count_their_targets_and_sum_their_loss", "cpu-split", "cpu-pipelined")),
    # Planning (the tests compare plans, not numbers): a row length the resource tables lack takes
    # an estimate again, whose caps all "spill" (v48: 3 programs an SM, uncapped, where 4 fit).
    Mutant("table_neighbours_keep_chunk_counts", "portable_softmax/kernel_resources.py",
           "CHUNK_CONSTEXPRS = frozenset({\"CHUNKS\", \"CHUNKS_P2\"})\n",
           "CHUNK_CONSTEXPRS = frozenset()\n",
           ("tests/test_first_call.py::test_split_rows_of_a_length_the_table_lacks_plan_from_rows_of_other_lengths",)),
    # Odd vocabularies' gradient rows in chunks of 8192 again (v48: 0.60 of the floor against 0.74).
    Mutant("loss_window_chunk_ignored", "portable_softmax/loss_planner.py",
           "        if align > 1 and 0 < tuning.loss_window_chunk < tuning.split_chunk:\n",
           "        if False:\n",
           _ids("tests/test_first_call.py::test_cuda_loss_rows_read_through_windows_take_chunks_of_4096", "32001")),
    # Aligned gradient rows whose last chunk pads 12% halved to chunks of 4096 again (v49: 4096x50304
    # 0.79 of the floor against 0.82).
    Mutant("loss_max_padding_ignored", "portable_softmax/loss_planner.py",
           "        if tuning.loss_max_padding:\n",
           "        if False:\n",
           _ids("tests/test_first_call.py::test_cuda_aligned_loss_rows_keep_chunks_of_8192", "4096-50304")),
    # A capture's own split scratch (from the graph's pool) kept for the stream's later eager
    # launches, which would then share memory the graph replays write.
    Mutant("capture_scratch_kept", "portable_softmax/launch.py",
           "                return _filled(device, slots, tiles), None\n",
           "                self._buffers[key] = _filled(device, slots, tiles)\n"
           "                return self._buffers[key], self.generation\n",
           _ids("tests/test_loss.py::test_a_capture_takes_scratch_of_its_own", "cpu")),
    # A capped variant the table lacks estimated afresh though its uncapped row is known.
    Mutant("uncapped_row_ignored", "portable_softmax/launch_plan.py",
           "        if uncapped is not None:\n",
           "        if False:\n",
           ("tests/test_first_call.py::test_a_capped_variant_the_table_lacks_takes_its_uncapped_row",)),
    # The uncapped row's excess taken however far over the cap it runs.
    Mutant("uncapped_row_always_taken", "portable_softmax/launch_plan.py",
           "            if spills < guess.spills:\n",
           "            if True:\n",
           ("tests/test_first_call.py::test_a_capped_variant_the_table_lacks_takes_its_uncapped_row",)),
    # A window row's edges worked by its first chunk, while a target among them is its last chunk's.
    Mutant("edges_in_first_chunk", "portable_softmax/kernels/loss_split.py",
           "    return chunk == (tl.sum(lead, 0) + n_cols - 1) // BLOCK_N\n",
           "    return chunk == 0\n",
           _ids("tests/test_loss.py::test_split_rows_match_torch", "cpu-bf16-50257-windows", "cpu-fp32-32001-none")
           + _ids("tests/test_loss.py::test_split_window_rows_with_targets_on_their_edges", "cpu-new-buffer")),
    # A target among a window row's edges left to the chunk its column lies in: two programs write
    # its gradient, the one-hot term's and the edges' own, in no order.
    Mutant("edge_target_left_to_its_column", "portable_softmax/kernels/loss_split.py",
           "                owner = tl.where(edge, (lead + n_cols - 1) // BLOCK_N, owner)\n",
           "",
           _ids("tests/test_loss.py::test_split_window_rows_with_targets_on_their_edges", "cpu-new-buffer",
                "cpu-inplace")),
    # A record's kept scratch taken after its pool grew (the old buffers, no longer the pool's).
    Mutant("held_scratch_past_growth", "portable_softmax/launch.py",
           "            if held is not None and held[0] == stream and held[1] == self._pool.generation:\n",
           "            if held is not None and held[0] == stream:\n",
           ("tests/test_loss.py::test_a_split_record_keeps_its_pools_buffers_until_the_pool_grows[cpu]",)),
    # The pool's buffers never kept: every launch looks them up under the lock.
    Mutant("held_scratch_never_kept", "portable_softmax/launch.py",
           "                self._held = None if generation is None else (stream, generation, scratch)\n",
           "                self._held = None\n",
           ("tests/test_loss.py::test_a_split_record_keeps_its_pools_buffers_until_the_pool_grows[cpu]",)),
    # Triton 3.6's C launch taken for a binary that asks for a global scratch (its launcher
    # object allocates it; the C launch would pass none).
    Mutant("c_launch_with_scratch", "portable_softmax/compat.py",
           "    if getattr(run, \"global_scratch_size\", 1) or getattr(run, \"profile_scratch_size\", 1):\n",
           "    if getattr(run, \"profile_scratch_size\", 1):\n",
           ("tests/test_versions.py::test_the_c_launch_is_taken_only_where_measured",)),
    # Windows declined where they need a chunk more (the rule before v51): such rows read an
    # element an instruction (H200: bf16 4096x49151 forward + backward 0.392 ms against 0.247).
    Mutant("windows_declined_for_a_chunk_more", "portable_softmax/split_planner.py",
           "    if windowed.regime != \"split\":\n",
           "    if dataclasses.replace(windowed, align=1) != plain:\n",
           _ids("tests/test_first_call.py::test_cuda_loss_rows_a_few_columns_short_of_whole_chunks_take_windows_unhalved",
                "28671-8")
           + ("tests/test_device_layer.py::test_split_windows_where_the_tuning_table_takes_them",)
           + _ids("tests/test_loss.py::test_split_rows_match_torch", "cpu-bf16-383-windows-a-chunk-more")),
    # Windowed gradient rows halved where their last chunk pads (v51: 8192x28671 0.402 ms
    # against 0.293).
    Mutant("loss_windows_halved", "portable_softmax/loss_planner.py",
           "        if tuning.loss_max_padding:\n",
           "        if align == 1 and tuning.loss_max_padding:\n",
           _ids("tests/test_first_call.py::test_cuda_loss_rows_a_few_columns_short_of_whole_chunks_take_windows_unhalved",
                "28671-8")),
    # Rows off 16-byte boundaries left to tiles, which have no windows (before v51: bf16
    # 8192x32001's backward 0.56 of copy against 0.95 split through windows).
    Mutant("tiles_without_windows", "portable_softmax/planner.py",
           "    if plain.regime == \"tile\" and n_cols >= shortest and _can_split(target, dtype, allow_split, n_cols):\n",
           "    if False:\n",
           ("tests/test_device_layer.py::test_rows_off_16_bytes_that_a_twice_read_tile_would_take_split_through_windows",
            "tests/test_device_layer.py::test_held_tiles_of_rows_off_16_bytes_split_through_windows_in_chunks_of_2048_or_more")),
    # Windowed rows halved to chunks of 1024 (v51: bf16 16384x16383 forward 0.61 of copy, at 2048 0.81).
    Mutant("window_min_chunk_ignored", "portable_softmax/planner.py",
           "    windowed = _split_config(target, tuning, n_rows, n_cols + align - 1, backward, halve_to=tuning.window_min_chunk)\n",
           "    windowed = _split_config(target, tuning, n_rows, n_cols + align - 1, backward)\n",
           ("tests/test_device_layer.py::test_held_tiles_of_rows_off_16_bytes_split_through_windows_in_chunks_of_2048_or_more",)),
    # Windows' own padding rule ignored: float32 rows a few columns short of whole chunks halved
    # (v51: softmax 8192x28671 forward 0.91 of copy against 0.96).
    Mutant("window_padding_ignored", "portable_softmax/planner.py",
           "    if padding is not None and windowed.chunks > plain.chunks:\n",
           "    if False:\n",
           ("tests/test_device_layer.py::test_float32_rows_whose_window_needs_a_chunk_more_keep_their_chunks",)),
    # ... or applied wherever windows are taken (it would move 4096x50257's float32 forward, unmeasured).
    Mutant("window_padding_everywhere", "portable_softmax/planner.py",
           "    if padding is not None and windowed.chunks > plain.chunks:\n",
           "    if padding is not None:\n",
           ("tests/test_device_layer.py::test_float32_rows_whose_window_needs_a_chunk_more_keep_their_chunks",)),
    # A windowed tile's edges left unwritten (v52: the window's groups it shares with the rows
    # beside it, stored apart).
    Mutant("tile_window_edges_unwritten", f"{KERNELS}/tile_windows.py",
           "    _edge_store(y_ptr, y_base, edge, edge_mask, tl.sum(out_edge, 0))\n",
           "    pass\n",
           _ids("tests/test_softmax.py::test_tile_rows_off_alignment_through_windows",
                "cpu-held-softmax-255-torch.bfloat16", "cpu-reread-log_softmax-201-torch.float32")),
    # A windowed tile's backward sum without its edges' terms.
    Mutant("tile_window_edge_sum_dropped", f"{KERNELS}/tile_windows.py",
           "    row_sum = (tl.sum(_grad_terms(y, dy, LOG), 1) + tl.sum(_grad_terms(y_edge, dy_edge, LOG), 1))[:, None]\n",
           "    row_sum = tl.sum(_grad_terms(y, dy, LOG), 1)[:, None]\n",
           _ids("tests/test_softmax.py::test_tile_rows_off_alignment_through_windows",
                "cpu-held-softmax-201-torch.bfloat16", "cpu-reread-softmax-255-torch.float16")),
    # Windowed tiles made taller by the wave fill: several rows a tile, which windows cannot take.
    Mutant("tile_window_taller_tiles", "portable_softmax/planner.py",
           "    if (programs is None and plan.regime == \"tile\" and not plan.reread and plan.align == 1\n",
           "    if (programs is None and plan.regime == \"tile\" and not plan.reread\n",
           ("tests/test_device_layer.py::test_tiles_of_one_row_take_windows_where_the_tuning_table_names_their_form",)),
    # Windowed tiles at the tile's own warps (v52: 16384x3001 bf16 forward 0.64 of copy, 0.90 at 4).
    Mutant("tile_window_warps_ignored", "portable_softmax/planner.py",
           "    per_thread = tuning.window_tile_elements_per_thread\n",
           "    per_thread = 0\n",
           ("tests/test_device_layer.py::test_tiles_of_one_row_take_windows_where_the_tuning_table_names_their_form",)),
    # bf16 backward rows of 2048-8191 columns off 16-byte boundaries kept as (twice-read) tiles
    # (v52: 16384x3001 0.53 of copy, 0.91 split through windows).
    Mutant("window_split_cols_ignored", "portable_softmax/planner.py",
           "    shortest = tuning.window_split_cols.get((_direction(backward), input_bytes), tuning.split_min_cols)\n",
           "    shortest = tuning.split_min_cols\n",
           ("tests/test_device_layer.py::test_tiles_of_one_row_take_windows_where_the_tuning_table_names_their_form",)),
    # A variant the table lacks takes the neighbour with the most registers (before v52): the
    # loss's 'sum' planned as the every-option form, 4 programs an SM (H200: 0.430 ms, 'mean' 0.252).
    Mutant("nearest_by_registers_alone", "portable_softmax/kernel_resources.py",
           "        ranked = [((len(options - taken), rank, len(form ^ other), -row.registers), row)\n"
           "                  for rank, (level, near) in enumerate(zip(self._neighbours, _near_keys(key)))\n"
           "                  for other, taken, row in level.get(near, ()) if taken <= options]\n",
           "        ranked = [((rank, -row.registers), row)\n"
           "                  for rank, (level, near) in enumerate(zip(self._neighbours, _near_keys(key)))\n"
           "                  for other, taken, row in level.get(near, ())]\n",
           ("tests/test_first_call.py::test_a_sum_the_table_lacks_is_planned_as_the_mean_not_as_every_option",)),
    # A neighbour with options the variant leaves off taken as its guess (v52: bf16 4096x50257
    # with smoothing planned from the every-option form's 204 spilled words, 4 programs an SM, 0.473
    # ms forward + backward against 0.348 at the 6 its binary fits).
    Mutant("nearest_takes_more_options", "portable_softmax/kernel_resources.py",
           "                  for other, taken, row in level.get(near, ()) if taken <= options]\n",
           "                  for other, taken, row in level.get(near, ())]\n",
           ("tests/test_first_call.py::test_a_variant_the_table_lacks_takes_no_neighbour_with_options_it_leaves_off",)),
    # float32 tiles of any length through windows (v52: 4096x781 forward 1.01 of copy -> 0.94; only
    # rows of more than 2048 columns gain, 4096x6001 0.80 -> 0.94).
    Mutant("tile_windows_shortest_ignored", "portable_softmax/planner.py",
           "            or shortest is None or n_cols < shortest):\n",
           "            or shortest is None):\n",
           ("tests/test_device_layer.py::test_tiles_of_one_row_take_windows_where_the_tuning_table_names_their_form",)),
    # The loss backward's window edges left unwritten (v53: 'none''s backward through windows).
    Mutant("loss_backward_window_edges_unwritten", f"{KERNELS}/loss.py",
           "                     _cast(g_edge * dloss[:, None], grad_ptr.dtype.element_ty), mask=edge_mask[None, :])\n",
           "                     _cast(g_edge * dloss[:, None], grad_ptr.dtype.element_ty), mask=edge[None, :] < 0)\n",
           _ids("tests/test_loss.py::test_streamed_backward_reads_and_writes_aligned_windows",
                "cpu-bf16-contiguous-plain", "cpu-fp32-odd-stride-inplace-every-option")),
    # Class weights under smoothing staged by the split form's pipeline (v53: bf16 8192x32000 at 1
    # program an SM, 0.870 ms against 0.389 unpipelined).
    Mutant("weighted_smoothing_pipelined", "portable_softmax/loss_planner.py",
           "    if writes_gradient and (column_loads or not tuning.loss_gradient_pipelined):\n",
           "    if writes_gradient and not tuning.loss_gradient_pipelined:\n",
           ("tests/test_loss.py::test_weighted_smoothing_split_rows_run_unpipelined",)),
    # Weighted smoothing with a softcap unpipelined at the plain form's warps (v53: fp32 8192x32000
    # 1.621 ms against 1.109 at twice the warps).
    Mutant("weighted_smoothing_softcap_warps", "portable_softmax/loss_planner.py",
           "    if column_loads and softcap:\n",
           "    if column_loads and softcap and False:\n",
           ("tests/test_loss.py::test_weighted_smoothing_split_rows_run_unpipelined",)),
    # The backward's windows taken where its gradient's rows lie elsewhere past their windows than
    # the logits' (rows sliced from a padded vocabulary, a contiguous gradient).
    Mutant("loss_backward_shifted_windows", "portable_softmax/loss_launch.py",
           "        return window_align(*window), False\n",
           "        return call_windows(*window)\n",
           _ids("tests/test_loss.py::test_streamed_backward_reads_and_writes_aligned_windows",
                "cpu-bf16-sliced-plain", "cpu-fp32-sliced-every-option")),
]


def _checkout_files(root: Path) -> list[str]:
    """This checkout's files as they are now: tracked and untracked, not ignored."""
    listed = subprocess.run(["git", "-C", str(root), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                            capture_output=True, text=True, check=True).stdout
    return [name for name in listed.split("\0") if name and (root / name).is_file()]


def _copy_checkout(root: Path, into: Path) -> None:
    """``root``'s files (``_checkout_files``) under ``into``, at the same paths."""
    for name in _checkout_files(root):
        target = into / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(root / name, target)


def _stale(mutant: Mutant, root: Path) -> Optional[str]:
    """Why ``mutant`` cannot be applied to ``root``'s files, or None."""
    path = root / mutant.path
    if not path.is_file():
        return f"{mutant.path} does not exist"
    found = path.read_text().count(mutant.original)
    if found != 1:
        return f"its snippet occurs {found} times in {mutant.path}, not once: {mutant.original.strip()[:70]!r}"
    return None


@dataclasses.dataclass
class Outcome:
    """What a mutant's tests did: ``killed`` (one failed, or they hung), the first that failed."""

    mutant: Mutant
    killed: bool
    evidence: str
    seconds: float


def _pytest(copy: Path, tests: tuple[str, ...], timeout: float, stop_at_first: bool) -> tuple[int, str]:
    """pytest's exit status and output for ``tests`` in ``copy`` (-1 past ``timeout``)."""
    # The copy's package, not an installed one: its root first on the path, in this process's
    # Python (the one with torch and Triton).
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(copy), os.environ.get("PYTHONPATH")]))}
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rfE", *(["-x"] * stop_at_first),
               *tests]
    try:
        run = subprocess.run(command, cwd=copy, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as expired:
        output = expired.stdout or b""
        return -1, output.decode(errors="replace") if isinstance(output, bytes) else output
    return run.returncode, run.stdout + run.stderr


def _first_failure(output: str) -> str:
    """The node id of the first test pytest's summary (``-rfE``) names as failed."""
    found = re.search(r"^(?:FAILED|ERROR) (\S+)", output, re.MULTILINE)
    return found.group(1) if found else "(no FAILED line)"


def _imports_the_copy(copy: Path) -> Optional[str]:
    """Why the copy's tests would not import the copy's package, or None."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(copy), os.environ.get("PYTHONPATH")]))}
    found = subprocess.run([sys.executable, "-c", "import portable_softmax; print(portable_softmax.__file__)"],
                           cwd=copy, env=env, capture_output=True, text=True).stdout.strip()
    if not found.startswith(str(copy)):
        return f"the copy imports portable_softmax from {found or 'nowhere'}, not from {copy}"
    return None


def run_mutant(mutant: Mutant, copy: Path, timeout: float) -> Outcome:
    """Apply ``mutant`` to ``copy``, run its tests, put the file back."""
    path = copy / mutant.path
    original = path.read_text()
    path.write_text(original.replace(mutant.original, mutant.replacement))
    start = time.monotonic()
    try:
        code, output = _pytest(copy, mutant.tests, timeout, stop_at_first=True)
    finally:
        path.write_text(original)
    seconds = time.monotonic() - start
    if code == -1:
        return Outcome(mutant, True, f"timed out after {timeout:.0f} s (a hang is a failure)", seconds)
    if code == 0:
        return Outcome(mutant, False, "", seconds)
    if code == 1:
        return Outcome(mutant, True, _first_failure(output), seconds)
    raise SystemExit(f"mutants: {mutant.name}: pytest exited {code} (not a test failure):\n{output[-3000:]}")


def _table(outcomes: list[Outcome]) -> str:
    """The outcomes as a Markdown table, a mutant a row."""
    lines = ["| mutant | file | result | failed first / why it survives | s |", "|---|---|---|---|---|"]
    for outcome in outcomes:
        mutant = outcome.mutant
        if outcome.killed:
            result = "killed" if not mutant.expected_survivor else "KILLED (marked expected survivor: remove the mark)"
            why = outcome.evidence
        else:
            result = "survived (expected)" if mutant.expected_survivor else "SURVIVED"
            why = mutant.expected_survivor or "no selected test failed: add a test that sees this bug"
        lines.append(f"| {mutant.name} | {mutant.path} | {result} | {why} | {outcome.seconds:.0f} |")
    return "\n".join(lines)


def main(argv: Optional[list[str]] = None) -> int:
    """Run the mutants the arguments name; the exit status of the module's docstring."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-m", "--mutant", action="append", default=[], metavar="NAME",
                        help="run only these mutants (repeat); default: all")
    parser.add_argument("--list", action="store_true", help="list the mutants and their tests; run nothing")
    parser.add_argument("--timeout", type=float, default=900, help="seconds a mutant's tests may take (default 900)")
    parser.add_argument("--no-baseline", action="store_true",
                        help="skip running the selected tests without mutants first (they must pass there)")
    parser.add_argument("--keep", action="store_true", help="keep the copy of the checkout (its path is printed)")
    args = parser.parse_args(argv)

    known = {mutant.name: mutant for mutant in MUTANTS}
    unknown = [name for name in args.mutant if name not in known]
    if unknown:
        parser.error(f"unknown mutant(s) {', '.join(unknown)}; known: {', '.join(known)}")
    chosen = [known[name] for name in args.mutant] if args.mutant else MUTANTS
    if args.list:
        for mutant in chosen:
            mark = f"  (expected survivor: {mutant.expected_survivor})" if mutant.expected_survivor else ""
            print(f"{mutant.name}: {mutant.path}{mark}")
            for test in mutant.tests:
                print(f"    {test}")
        return 0
    stale = [f"{mutant.name}: {why}" for mutant in chosen if (why := _stale(mutant, ROOT))]
    if stale:
        print("mutants: stale, update them:\n  " + "\n  ".join(stale), file=sys.stderr)
        return 2

    copy = Path(tempfile.mkdtemp(prefix="portable-softmax-mutants-"))
    try:
        _copy_checkout(ROOT, copy)
        problem = _imports_the_copy(copy)
        if problem:
            print(f"mutants: {problem}", file=sys.stderr)
            return 2
        if not args.no_baseline:
            selected = tuple(dict.fromkeys(test for mutant in chosen for test in mutant.tests))
            print(f"baseline: {len(selected)} selections without mutants ...", file=sys.stderr, flush=True)
            code, output = _pytest(copy, selected, args.timeout * len(chosen), stop_at_first=False)
            if code != 0:
                print(f"mutants: the selected tests fail (exit {code}) without any mutant:\n{output[-3000:]}",
                      file=sys.stderr)
                return 2
        outcomes = []
        for mutant in chosen:
            print(f"{mutant.name} ...", file=sys.stderr, flush=True)
            outcomes.append(run_mutant(mutant, copy, args.timeout))
    finally:
        if args.keep:
            print(f"copy kept at {copy}", file=sys.stderr)
        else:
            shutil.rmtree(copy, ignore_errors=True)
    print(_table(outcomes))
    wrong = [o for o in outcomes if o.killed == bool(o.mutant.expected_survivor)]
    killed = sum(o.killed for o in outcomes)
    print(f"\n{killed} of {len(outcomes)} killed; {len(outcomes) - killed - len(wrong)} expected survivor(s); "
          f"{len(wrong)} unexpected result(s)")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
