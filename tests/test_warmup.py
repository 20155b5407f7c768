"""``portable-softmax warmup``: on a CPU (Triton's interpreter) and for a recorded chip it plans each
call and lists what would compile, compiling nothing; on a GPU it makes each call once, so that a
later process finds the kernels in Triton's cache (``benchmarks/device.sh firstcall`` shows it)."""
from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
from triton.runtime import jit

from portable_softmax import cli, compat, launch, launch_compile, warmup
from portable_softmax.backend import get_backend


def _run(argv: list[str], capsys: pytest.CaptureFixture) -> tuple[int, str, str]:
    code = cli.main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def test_on_the_interpreter_it_plans_and_compiles_nothing(capsys, monkeypatch):
    compiled = []
    monkeypatch.setattr(launch, "_compiled_resources", lambda *a: compiled.append(a))
    code, out, err = _run(["warmup", "--device", "cpu", "--shape", "4096x50257", "--dtype", "bfloat16", "--backward",
                           "--loss"], capsys)
    assert code == 0 and not compiled
    assert "Triton's interpreter: nothing to compile" in out
    lines = [line for line in out.splitlines()[1:] if line.strip()]
    # softmax forward and backward, the loss's stats, forward, sum and its gradient's rescale
    assert len(lines) == 6 and all(line.rstrip().endswith("nothing to compile") for line in lines)
    assert "warmup [1/2] softmax 4096x50257 bfloat16 dim -1 forward+backward" in err  # the progress, tqdm or not


def test_for_a_recorded_chip_it_lists_one_kernel_per_launch(capsys):
    code, out, _ = _run(["warmup", "--profile", "h100", "--shape", "4096x50257", "--shape", "32768x1024",
                         "--dim", "0", "--dim", "-1", "--dtype", "bfloat16", "--backward", "--loss", "--json",
                         "--no-progress"], capsys)
    assert code == 0
    report = json.loads(out)
    launches = {(call["call"], launch["what"]): launch for call in report["calls"] for launch in call["launches"]}
    split = launches[("softmax 4096x50257 bfloat16 dim -1 forward+backward", "forward")]
    assert split["regime"] == "split" and len(split["kernels"]) == 1
    assert split["kernels"][0]["kernel"] == "softmax_forward_split"
    assert split["kernels"][0]["resources"] in (warmup.IN_TABLE, warmup.NEAR, warmup.ESTIMATED)
    # A column softmax of 32768 rows over dim 0: rows side by side, sliced in two launches.
    column = launches[("softmax 32768x1024 bfloat16 dim 0 forward+backward", "forward")]
    assert [k["kernel"] for k in column["kernels"]] == ["softmax_forward_partials", "softmax_forward_normalize"]
    scale = launches[("cross_entropy 4096x50257 bfloat16 forward+backward", "gradient scale")]
    assert scale["kernels"] == [{"kernel": "cross_entropy_grad_scale", "resources": warmup.UNSIZED}]
    # The default 'mean' split over a resident grid counts its targets and sums its loss itself: no
    # stats launch before it, no sum after it; the forward alone's 'mean' is one program after it.
    training = "cross_entropy 4096x50257 bfloat16 forward+backward"
    assert launches[(training, "forward")]["regime"] == "split"
    assert (training, "stats") not in launches and (training, "loss sum") not in launches
    code, out, _ = _run(["warmup", "--profile", "h100", "--shape", "4096x50257", "--dtype", "bfloat16", "--loss",
                         "--json", "--no-progress"], capsys)
    alone = {launch["what"]: launch for call in json.loads(out)["calls"] for launch in call["launches"]}
    assert alone["loss sum"]["kernels"] == [{"kernel": "cross_entropy_sum", "resources": warmup.UNSIZED}]
    assert alone["loss sum"]["programs"] == 1


def test_the_calls_it_warms(capsys):
    calls = warmup.warmup_calls([(8, 16), (2, 3, 4)], ["float32", "bfloat16"], [-1, 0], log=True, backward=True,
                                loss=True)
    assert len(calls) == 2 * 2 * 2 * 2 + 2  # shapes x dtypes x dims x (softmax, log_softmax), the 2-D loss
    assert {c.function for c in calls} == {"softmax", "log_softmax", "cross_entropy"}
    assert all(c.backward for c in calls)


@pytest.mark.parametrize("argv, needle", [
    (["--shape", "8x16", "--dim", "2"], "--dim 2 is out of range"),
    (["--shape", "2x3x4", "--loss"], "--loss needs a 2-D --shape"),
])
def test_mistakes_are_one_line(argv, needle, capsys):
    code, _, err = _run(["warmup", "--device", "cpu", "--no-progress", *argv], capsys)
    assert code == 2 and needle in err and len(err.strip().splitlines()) == 1


# A process's kernel keys as Triton 3.6 computes them (H200 and H100, 2026-11): a function's key
# holds the constexpr globals of its callees as far as the process had hashed them, since
# DependenciesFinder._update_hash merged a callee's globals before computing its key.
def _update_hash_of_triton_3_6(self, func) -> None:
    self.used_global_vals.update(func.used_global_vals)
    self.hasher.update((func.cache_key + str(getattr(func, "noinline", False))).encode("utf-8"))


def _kernel_functions() -> list:
    return [value for name, module in list(sys.modules.items()) if name.startswith("portable_softmax.kernels.")
            for value in vars(module).values()
            if isinstance(value, jit.JITFunction) and value.fn.__module__.startswith("portable_softmax.kernels.")]


def _forget_keys() -> None:
    """Every kernel function's key as in a fresh process: not yet computed."""
    for function in _kernel_functions():
        function.hash, function.used_global_vals = None, {}


def _loss_key(softmax_first: bool, launched: bool, monkeypatch) -> str:
    """The cross-entropy split forward's key in a fresh process (``launched``: through the launch
    layer, which compiles nothing before it hands out the kernels) that compiles the softmax's
    split kernels first, as ``portable-softmax warmup --backward --loss`` does, or the loss alone,
    as a training process's first loss call."""
    _forget_keys()
    monkeypatch.setattr(launch_compile, "_settled", False)
    from portable_softmax import kernels

    if launched:
        kernels = launch._kernel_module(get_backend("cuda"))
    if softmax_first:
        kernels.softmax_forward_split.cache_key, kernels.softmax_backward_split.cache_key
    return kernels.cross_entropy_forward_split.cache_key


def test_a_warmup_keys_the_kernels_as_the_later_call_does(monkeypatch):
    """Triton's disk cache keys a binary by its function's key too: under Triton 3.6 the warmup,
    which compiled the softmax first, left the loss's split forward keyed otherwise than a process
    calling the loss alone keys it, and the H200's first loss call after the warmup compiled it
    (1.2 s, v31). The launch layer settles every key before the first compile."""
    monkeypatch.setattr(jit.DependenciesFinder, "_update_hash", _update_hash_of_triton_3_6)
    monkeypatch.setattr(compat, "JIT_HASH_BY_ORDER", True)
    try:
        unsettled = {_loss_key(first, False, monkeypatch) for first in (True, False)}
        if len(unsettled) == 1:
            pytest.skip("this Triton's keys hold no globals of the callees (3.2): nothing depends on the order")
        settled = {_loss_key(first, True, monkeypatch) for first in (True, False)}
        assert len(settled) == 1
    finally:
        _forget_keys()  # computed again, by this Triton's own hashing, where next asked


def test_settled_keys_are_the_fixed_point_of_hashing_again(monkeypatch):
    """``compat.settle_jit_hashes`` hashes each function once, callees first: the keys must be
    those that hashing every function again, until none changes, arrives at (what it did before,
    in three passes), so that a callee it failed to place first would show here."""
    monkeypatch.setattr(jit.DependenciesFinder, "_update_hash", _update_hash_of_triton_3_6)
    from portable_softmax import kernels
    try:
        _forget_keys()
        compat.settle_jit_hashes(kernels)
        settled = {id(f): f.cache_key for f in _kernel_functions()}
        for _ in range(len(settled)):
            for function in _kernel_functions():
                function.hash = None
            again = {id(f): f.cache_key for f in _kernel_functions()}
            if again == settled:
                break
            settled = again
        _forget_keys()
        compat.settle_jit_hashes(kernels)
        assert {id(f): f.cache_key for f in _kernel_functions()} == settled
    finally:
        _forget_keys()


def _first_call_script():
    path = Path(__file__).resolve().parent.parent / "benchmarks" / "first_call.py"
    spec = importlib.util.spec_from_file_location("first_call_script", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_first_call_names_a_kernel_keyed_otherwise_after_the_warmup(monkeypatch):
    """``benchmarks/first_call.py``'s missed keys: the JIT's key alone (what Triton's
    jit_cache_hook reports) was the same for the warmup's and the call's loss kernel, so the report
    came back empty while the call compiled; the function's key tells them apart."""
    script = _first_call_script()
    monkeypatch.setattr(jit.DependenciesFinder, "_update_hash", _update_hash_of_triton_3_6)
    from portable_softmax import kernels

    split = kernels.cross_entropy_forward_split
    info = jit.JitFunctionInfo(split.fn.__module__, split.fn.__name__, split)
    jit_key = {"specialization_data": '{"name": "cross_entropy_forward_split"}'}
    try:
        keys = {}
        for which, softmax_first in (("warmup", True), ("call", False)):
            _forget_keys()
            if softmax_first:
                kernels.softmax_forward_split.cache_key
            keys[which] = [script.compile_key(info, jit_key, "repr")]
        if keys["warmup"] == keys["call"]:
            pytest.skip("this Triton's keys hold no globals of the callees (3.2): nothing depends on the order")
        (line,) = script.missed(keys["call"], keys["warmup"])
        assert line.startswith("the same JIT key, the function keyed") and "cross_entropy_forward_split" in line
        assert script.missed(keys["warmup"], keys["warmup"]) == []
    finally:
        _forget_keys()


def test_plan_diff_prints_each_planned_launch_and_what_a_revision_moved(monkeypatch, capsys):
    """``benchmarks/plan_diff.py``: a line a launch ``warmup`` plans (softmax and the loss, forward
    alone and with the backward); against a revision whose package plans the same, nothing moved;
    against lines that differ, only those."""
    path = Path(__file__).resolve().parent.parent / "benchmarks" / "plan_diff.py"
    spec = importlib.util.spec_from_file_location("plan_diff_script", path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    lines = script.plan_lines(["h200"], ["4096x50257"], ["bfloat16"])
    assert any(" fwd+bwd 4096x50257 cross_entropy forward: split " in line for line in lines)
    assert any(" fwd 4096x50257 cross_entropy forward: loop " in line for line in lines)
    assert any(" softmax backward: " in line for line in lines)
    # HEAD's package, archived and planned in a process of its own (its plans may differ from this
    # tree's where the tree has changes: only their form is checked).
    base = script._base_lines("HEAD", ["--profile=h200", "--shape=4096x50257", "--dtype=bfloat16"])
    assert base and all(line.startswith("h200 bfloat16 ") for line in base), base
    argv = ["plan_diff.py", "--base", "HEAD", "--profile", "h200", "--shape", "4096x50257", "--dtype", "bfloat16"]
    moved = lines[:1] + [lines[1].replace("occupancy", "occupancy 1 +")] + lines[2:]
    monkeypatch.setattr(script, "_base_lines", lambda rev, selection: moved)
    monkeypatch.setattr(sys, "argv", argv)
    script.main()
    out = capsys.readouterr().out.splitlines()
    assert out[2:] == [f"-{moved[1]}", f"+{lines[1]}"], out
