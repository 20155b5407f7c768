"""A cold first call plans from what its kernel variants are known to occupy and compiles only the
variant it launches (issue 34 item 4). Counted on a recorded H100 with a fake compiler: no GPU,
no Triton compile (the interpreter compiles nothing, so a CPU run could not count).

Before the tables (``benchmarks/probes/first_call_compiles.py``: real sm_90 cross-compiles, the
launches stubbed, 2026-11-26): a first bf16 softmax of 4096x50257 compiled 6 variants (ticketed
and persistent, each uncapped and under two register caps), 9 with its backward, a masked
attention call 5.
"""
from __future__ import annotations

import dataclasses
import threading
from importlib import resources
from typing import Optional

import pytest
import torch

import portable_softmax as ps
from portable_softmax import launch, launch_compile, launch_plan, loss_launch, op_calls, variants
from portable_softmax.backend import get_backend
from portable_softmax.crosscompile.cases import FUSED_FORM, LOSS_FORMS, Case, _fused_scalars, loss_plan_options
from portable_softmax.crosscompile.targets import parse_target, target_record
from portable_softmax.kernel_resources import FOLDER, ResourceTable, argument_signature, table_from_json, variant_key
from portable_softmax.launch_plan import Fusion, RowView, Variant, plan_checked
from portable_softmax.plan_grid import KernelConfig, LaunchPlan
from portable_softmax.planner import DTYPE_BYTES
from portable_softmax.profiles import profile_record
from portable_softmax.record import KernelResources
from portable_softmax.targets import target_for

H100 = profile_record("h100")
# (The loss's stats kernel takes the class targets first.)
TORCH_POINTERS = {torch.bfloat16: "*bf16", torch.float16: "*fp16", torch.float32: "*fp32", torch.float64: "*fp64",
                  torch.int64: "*i64"}


def _shipped() -> list[ResourceTable]:
    folder = resources.files("portable_softmax").joinpath(FOLDER)
    return [table_from_json(entry.read_text()) for entry in sorted(folder.iterdir(), key=lambda e: e.name)
            if entry.name.endswith(".json")]


def _h100_table() -> ResourceTable:
    """The newest shipped table of sm_90 (any Triton): the fake compiler's truth."""
    tables = [t for t in _shipped() if (t.backend, t.arch) == ("cuda", "sm_90")]
    if not tables:
        pytest.fail("no shipped table of known resources for cuda sm_90 (portable-softmax compile --table)")
    return max(tables, key=lambda t: tuple(int(p) for p in t.triton.split(".")[:3] if p.isdigit()))


class FakeCompiler:
    """Compiles nothing: answers each variant the launch asks for as the table holds it (or its
    nearest row, ``ResourceTable.nearest``), or as ``changed`` says, and notes each request, as
    ``launch._compiled_resources`` is called."""

    def __init__(self, table: ResourceTable, changed: dict[str, KernelResources] = None) -> None:
        self.table, self.changed, self.asked = table, changed or {}, []

    def key(self, kernel, args, constexprs, options) -> str:
        scalars = [a for a in args if not isinstance(a, (torch.Tensor, torch.dtype))]
        return variant_key(kernel.fn.__name__, TORCH_POINTERS[args[0].dtype], argument_signature(scalars), constexprs,
                           options)

    def __call__(self, kernel, backend, device, args, constexprs, options) -> KernelResources:
        key = self.key(kernel, args, constexprs, options)
        self.asked.append(key)
        found = self.changed.get(key) or self.table.nearest(key)
        if found is None:
            pytest.fail(f"the sm_90 table of Triton {self.table.triton} holds no row near {key}: regenerate it "
                        f"(portable_softmax/kernel_resources/README.md)")
        return found


class Launched:
    """Stands for ``launch.LaunchRecord``: notes what the record would launch, launches nothing."""

    records: list = []

    def __init__(self, kernel, backend, device, plan, scalars, launches, options) -> None:
        self.plan, self.kernel, self.scalars = plan, kernel.fn.__name__, scalars
        self.launches, self.options, self._kernel, self.calls = launches, options, kernel, 0
        Launched.records.append(self)

    def __call__(self, tensors) -> LaunchPlan:
        self.calls += 1
        return self.plan

    def compile(self, tensors) -> None:
        # As ``LaunchRecord.compile``: each launch's binary asked for at the compile door.
        for constexprs in self.launches:
            launch._compiled_resources(self._kernel, None, None, (*tensors, *self.scalars), constexprs, self.options)


@pytest.fixture
def h100(monkeypatch):
    """The launch layers pointed at a recorded H100 whose compiles the returned fake answers."""
    table = _h100_table()
    fake = FakeCompiler(table)
    Launched.records = []
    for module in (launch, loss_launch):
        monkeypatch.setattr(module, "backend_for", lambda device: get_backend("cuda"))
        monkeypatch.setattr(module, "device_record", lambda device: H100)
        monkeypatch.setattr(module, "LaunchRecord", Launched)
        monkeypatch.setattr(module, "_compiled_resources", lambda *a: fake(*a))
    monkeypatch.setattr(launch, "table_for", lambda *a: table)
    return fake


def _rows(rows: int, cols: int, tensors: int) -> RowView:
    return RowView(1, rows, cols, ((0, cols, 1),) * tensors)


# (what, direction, dtype, view, fusion): the calls of issue 34's first-call table. Small stand-in
# tensors carry the dtypes; the view carries the shape.
ATTENTION = Fusion(1, 1, False, (0.125, 16, 1024, 0, 0, 0, 1, 0, 0, 0))
SOFTMAX_CALLS = [
    ("4096x50257 bf16 forward (split)", "forward", torch.bfloat16, _rows(4096, 50257, 2), None),
    ("4096x50257 bf16 backward (split)", "backward", torch.bfloat16, _rows(4096, 50257, 3), None),
    ("32x128256 fp32 forward (few rows, split)", "forward", torch.float32, _rows(32, 128256, 2), None),
    ("32768x256 bf16 forward (tiles, wave fill)", "forward", torch.bfloat16, _rows(32768, 256, 2), None),
    ("attention 8x16x1024x1024 bf16, scale and mask (fused tiles)", "forward", torch.bfloat16,
     RowView(1, 8 * 16 * 1024, 1024, ((0, 1024, 1),) * 2), ATTENTION),
]


@pytest.mark.parametrize("what, direction, dtype, view, fusion", SOFTMAX_CALLS, ids=[c[0] for c in SOFTMAX_CALLS])
def test_a_first_call_compiles_only_the_variant_it_launches(h100, what, direction, dtype, view, fusion):
    tensors = tuple(torch.empty(4, dtype=dtype) for _ in variants.TENSORS[direction])
    if fusion is not None:
        tensors = (*tensors, torch.ones(4, dtype=torch.bool), tensors[0])
    launch.build_record(direction, tensors, view, False, False, fusion=fusion)
    (record,) = Launched.records
    # One compile, and it is the binary that launches (the first launch finds it in Triton's cache).
    kernel = getattr(launch._kernel_module(get_backend("cuda")), record.kernel)
    assert h100.asked == [h100.key(kernel, (*tensors, *record.scalars), record.launches[0], record.options)]


def test_a_first_cross_entropy_compiles_only_the_kernel_it_launches(h100):
    logits = torch.empty(4, dtype=torch.bfloat16)
    per_position = (0, 1, 0)
    strides = tuple((0, 50257, 1) if name in ("x", "grad") else per_position
                    for name in variants.loss_row_tensors("forward"))
    tensors = (logits, torch.zeros(4, dtype=torch.int64), logits, torch.empty(6), torch.empty(4), torch.empty(4),
               logits)
    # The default training call: a 'mean' whose split grid counts its targets and sums its loss.
    loss_launch._record("forward", tensors, RowView(1, 4096, 50257, strides),
                        variants.LossFacts(write_grad=True, counted=True, summed=True), (-100,))
    (record,) = Launched.records
    kernel = getattr(launch._kernel_module(get_backend("cuda")), record.kernel)
    assert h100.asked == [h100.key(kernel, (*tensors, *record.scalars), record.launches[0], record.options)]


def test_a_launch_whose_binary_differs_from_the_table_is_planned_again(h100):
    """The table said the persistent split forward fits 8 programs a unit; its binary holds more
    registers (4 a unit): the plan is made again from the compiled numbers, and its grid is
    sized from the binary that launches."""
    view, tensors = _rows(4096, 50257, 2), (torch.empty(4, dtype=torch.bfloat16), torch.empty(4, dtype=torch.bfloat16))
    launch.build_record("forward", tensors, view, False, False)
    first = Launched.records.pop()
    key = h100.asked[0]
    heavier = dataclasses.replace(h100.table.nearest(key), registers=200, spills=0)
    h100.changed[key] = heavier
    h100.asked.clear()
    launch.build_record("forward", tensors, view, False, False)
    second = Launched.records.pop()
    assert 2 <= len(h100.asked) <= 4 and len(set(h100.asked)) == len(h100.asked)
    assert h100.asked[0] == key and second.plan != first.plan
    # The plan's occupancy is that of the binary it launches.
    launched = h100.changed.get(h100.asked[-1]) or h100.table.nearest(h100.asked[-1])
    assert second.plan.occupancy == target_for(H100).occupancy(H100, launched)


class Beside:
    """The fake compiler, noting each request's thread and key, and holding the first compile of
    a kernel named ``held`` (the forward's, in the calling thread) until a kernel named ``other``
    has been asked for from a compile-ahead thread, at most 10 s: compiled one after the other, it
    would wait in vain (``overlapped`` False)."""

    def __init__(self, fake: FakeCompiler, held: str, other: str) -> None:
        self.fake, self.held, self.other = fake, held, other
        self.asked: list[tuple[str, str, tuple]] = []  # (thread, kernel, (key, the door's specialization))
        self.other_asked = threading.Event()
        self.overlapped: Optional[bool] = None

    def __call__(self, kernel, backend, device, args, constexprs, options) -> KernelResources:
        name, thread = kernel.fn.__name__, threading.current_thread().name
        key = self.fake.key(kernel, args, constexprs, options)
        # Every pointer's dtype and alignment too: a stand-in for a tensor must be keyed as it is.
        self.asked.append((thread, name, (key, launch_compile._specialization(args))))
        if name.startswith(self.other) and thread == launch_compile.AHEAD_THREAD:
            self.other_asked.set()
        if name.startswith(self.held) and self.overlapped is None:
            self.overlapped = self.other_asked.wait(10)
        # The grad scale is in no table: it plans without resources.
        return self.fake.table.nearest(key) or KernelResources(32, 0, options["num_warps"])

    def keys(self, ahead: bool, kernel: str) -> list[str]:
        """The keys of ``kernel`` asked for from a compile-ahead thread (or from the others)."""
        # Until none is left: a build ahead starts a compile ahead of its own (``SlicedRecord.compile``).
        while True:
            running = [t for t in threading.enumerate() if t.name == launch_compile.AHEAD_THREAD and t.is_alive()]
            if not running:
                break
            for thread in running:
                thread.join(10)
        return [key for thread, name, key in self.asked
                if name.startswith(kernel) and (thread == launch_compile.AHEAD_THREAD) == ahead]


@pytest.fixture
def beside(h100, monkeypatch):
    """The recorded H100 of ``h100`` through the public functions, whose call tables are emptied
    before and after; returns a factory of ``Beside`` compilers, installed."""
    monkeypatch.setattr(launch_compile, "backend_for", lambda device: get_backend("cuda"))
    monkeypatch.setattr(launch_compile, "device_record", lambda device: H100)

    def install(held: str, other: str) -> Beside:
        compiler = Beside(h100, held, other)
        for module in (launch, loss_launch):
            monkeypatch.setattr(module, "_compiled_resources", compiler)
        return compiler
    op_calls._forget_calls()
    loss_launch._forget()
    yield install
    op_calls._forget_calls()
    loss_launch._forget()


def test_a_forward_that_requires_grad_compiles_its_backward_beside_its_own(beside):
    """The cold forward + backward: the backward's binary is asked for from a thread of its own
    while the forward's compiles, and it is the one the backward's own build asks for (which the
    compile door then finds, or waits for)."""
    compiler = beside("softmax_forward", "softmax_backward")
    x = torch.empty(64, 50257, dtype=torch.bfloat16, requires_grad=True)
    ps.softmax(x, -1).backward(torch.empty(64, 50257, dtype=torch.bfloat16))
    ahead = compiler.keys(True, "softmax_backward")
    assert compiler.overlapped and ahead and ahead == compiler.keys(False, "softmax_backward")
    assert not compiler.keys(True, "softmax_forward")


def test_a_forward_without_grad_compiles_no_backward(beside):
    compiler = beside("nothing held", "softmax_backward")
    ps.softmax(torch.empty(64, 50257, dtype=torch.bfloat16), -1)
    with torch.no_grad():
        ps.softmax(torch.empty(64, 50257, dtype=torch.bfloat16, requires_grad=True), -1)
    assert compiler.keys(True, "") == [] and compiler.keys(False, "softmax_")


def test_a_cross_entropy_that_writes_its_gradient_compiles_its_rescale_beside_its_forward(beside):
    """The loss's forward writes the gradient; its backward rescales it by the loss's gradient
    (one value of the loss's dtype): that kernel is compiled ahead, and the backward launches
    through the record it was compiled for."""
    compiler = beside("cross_entropy_forward", variants.GRAD_SCALE_KERNEL)
    logits = torch.empty(64, 50257, dtype=torch.bfloat16, requires_grad=True)
    ps.cross_entropy(logits, torch.zeros(64, dtype=torch.int64)).backward()
    assert compiler.overlapped and len(compiler.keys(True, variants.GRAD_SCALE_KERNEL)) == 1
    (scale,) = [r for r in Launched.records if r.kernel == variants.GRAD_SCALE_KERNEL]
    assert scale.calls == 1


def test_a_cross_entropy_mean_compiles_its_stats_beside_its_forward(beside):
    """The stats of a 'mean' of class targets (``cross_entropy_stats``): compiled ahead, beside
    the forward's compile, while the first call of the layout forms them with torch's operations;
    the next call launches the record it was compiled for."""
    compiler = beside("cross_entropy_forward", variants.STATS_KERNEL)
    # Weighted: the forward alone of an unweighted 'mean' forms no stats (below).
    logits, weight = torch.empty(64, 50257, dtype=torch.bfloat16), torch.ones(50257, dtype=torch.bfloat16)
    target = torch.zeros(64, dtype=torch.int64)
    ps.cross_entropy(logits, target, weight)
    assert compiler.overlapped and len(compiler.keys(True, variants.STATS_KERNEL)) == 1
    (stats,) = [r for r in Launched.records if r.kernel == variants.STATS_KERNEL]
    assert stats.calls == 0 and stats.plan.programs == 1
    ps.cross_entropy(logits, target, weight)
    assert stats.calls == 1 and [r for r in Launched.records if r.kernel == variants.STATS_KERNEL] == [stats]
    assert compiler.keys(False, variants.STATS_KERNEL) == []


def test_a_cross_entropy_mean_without_grad_compiles_its_counted_sum_beside_its_forward(beside):
    """The forward alone of an unweighted 'mean': no stats; its mean divided in the sum's one
    program (``loss_reduction.counted_mean``), compiled ahead (after the forward's launch, whose
    terms it is keyed on) while the first call divides with torch's operations; the next call
    launches it."""
    compiler = beside("nothing held", variants.SUM_KERNEL)
    logits = torch.empty(64, 50257, dtype=torch.bfloat16)
    target = torch.zeros(64, dtype=torch.int64)
    ps.cross_entropy(logits, target)
    assert len(compiler.keys(True, variants.SUM_KERNEL)) == 1 and not compiler.keys(False, variants.SUM_KERNEL)
    (summed,) = [r for r in Launched.records if r.kernel == variants.SUM_KERNEL]
    assert summed.calls == 0 and summed.plan.programs == 1
    ps.cross_entropy(logits, target)
    assert summed.calls == 1 and not [r for r in Launched.records if r.kernel == variants.STATS_KERNEL]


H200 = profile_record("h200")


class FirstLaunch(Launched):
    """``Launched`` whose first call asks for its binary at the compile door with the call's
    tensors, as ``LaunchRecord``'s first launch does."""

    def __call__(self, tensors) -> LaunchPlan:
        if not self.calls:
            self.compile(tensors)
        return super().__call__(tensors)


@pytest.fixture
def h200(beside, monkeypatch):
    """``beside`` on a recorded H200, whose bf16 column softmax is sliced in both directions
    (``Tuning.strided_slices``), with records whose first launch asks for its binary."""
    for module in (launch, launch_compile):
        monkeypatch.setattr(module, "device_record", lambda device: H200)
    monkeypatch.setattr(launch, "LaunchRecord", FirstLaunch)
    return beside


# A column softmax (over dim 0) that the H200 slices in both directions, in two launches each.
COLUMNS = (16384, 64)


@pytest.mark.parametrize("direction, aligned", [("forward", True), ("backward", True), ("forward", False)])
def test_a_sliced_first_call_compiles_its_normalize_beside_its_partials(h200, direction, aligned):
    """A sliced call's two launches (partials, then normalize): on its first call the normalize's
    binary is asked for from a thread of its own while the partials' compiles, so before the
    partials launch, and it is the binary the normalize's launch asks for (for an input not
    16-byte aligned too). A repeated call asks for nothing. Fails where the first launches
    compile one after the other."""
    partials, normalize = (f"softmax_{direction}_{phase}" for phase in ("partials", "normalize"))
    compiler = h200(partials, normalize)
    x = torch.empty(COLUMNS[0] * COLUMNS[1] + 1, dtype=torch.bfloat16)[1 - aligned:][:COLUMNS[0] * COLUMNS[1]]
    x = x.view(COLUMNS)
    call = ((lambda: ps.softmax(x, 0)) if direction == "forward"
            else lambda: op_calls._backward(x, torch.empty(COLUMNS, dtype=torch.bfloat16), 0, torch.bfloat16, False))
    call()
    assert [r.kernel for r in Launched.records] == [partials, normalize]
    ahead = compiler.keys(True, normalize)
    assert compiler.overlapped and len(ahead) == 1 and ahead == compiler.keys(False, normalize)
    assert not compiler.keys(True, partials)
    compiler.asked.clear()
    call()
    assert compiler.asked == [] and [r.calls for r in Launched.records] == [2, 2]


def test_a_sliced_forward_that_requires_grad_compiles_its_sliced_backward_beside_it(h200):
    """The cold forward + backward of a column softmax, both sliced: the backward's two binaries
    are asked for from threads ahead while the forward's compile, and they are those its launches
    ask for. Fails where building a sliced record compiles nothing (its binaries then wait for
    the backward's launches)."""
    compiler = h200("softmax_forward_partials", "softmax_backward_partials")
    x = torch.empty(COLUMNS, dtype=torch.bfloat16, requires_grad=True)
    ps.softmax(x, 0).backward(torch.empty(COLUMNS, dtype=torch.bfloat16))
    assert compiler.overlapped
    for phase in ("partials", "normalize"):
        ahead = compiler.keys(True, f"softmax_backward_{phase}")
        assert ahead and set(ahead) == set(compiler.keys(False, f"softmax_backward_{phase}"))


def _config(name: str) -> KernelConfig:
    return KernelConfig("tile", 1, 1024, 1, 4 if name == "narrow" else 8)


def _variant(name: str) -> Variant:
    return Variant.of(f"kernel_{name}", (), {}, {"num_warps": 4}, _config(name))


def test_plan_checked_compiles_the_launched_variant_once_where_the_known_numbers_hold():
    compiled = []
    known = {"a": KernelResources(40, 0, 4), "b": KernelResources(30, 0, 4)}

    def plan(lookup):
        # Weighs two candidates, launches the one of fewer registers.
        return min("ab", key=lambda name: lookup(_variant(name)).registers)
    found, chosen = plan_checked(plan, lambda name, lookup: [_variant(name)],
                                 lambda v: known[v.kernel[-1]], lambda v: compiled.append(v) or known[v.kernel[-1]])
    assert found == "b" and chosen == [_variant("b")] and compiled == [_variant("b")]


def test_plan_checked_plans_again_until_the_launched_numbers_are_compiled_ones():
    compiled = []
    known = {"a": KernelResources(40, 0, 4), "b": KernelResources(30, 0, 4), "c": KernelResources(50, 0, 4)}
    truth = {**known, "b": KernelResources(90, 0, 4), "a": KernelResources(60, 0, 4)}

    def compile(variant):
        compiled.append(variant.kernel[-1])
        return truth[variant.kernel[-1]]
    found, chosen = plan_checked(lambda lookup: min("abc", key=lambda name: lookup(_variant(name)).registers),
                                 lambda name, lookup: [_variant(name)], lambda v: known[v.kernel[-1]], compile)
    # b compiled heavier than known, then a: c, as known, is what the compiled numbers choose.
    assert compiled == ["b", "a", "c"] and found == "c"


def test_plan_checked_ends_when_the_known_numbers_keep_failing():
    compiled = []
    names = "abcdef"

    def compile(variant):
        compiled.append(variant.kernel[-1])
        return KernelResources(200 - names.index(variant.kernel[-1]), 0, 4)
    found, _ = plan_checked(lambda lookup: min(names, key=lambda name: lookup(_variant(name)).registers),
                            lambda name, lookup: [_variant(name)], lambda v: KernelResources(10, 0, 4), compile)
    # Each round's choice compiled heavier than known: every candidate once, the lightest chosen.
    assert compiled == list(names) and found == "f"


def _case_calls(record, case: Case):
    """What a first call of ``case`` plans: (function, its call, view)."""
    target = target_for(record)
    size = DTYPE_BYTES[case.dtype]
    if case.loss:
        per_position = (0, 1 if case.rows > 1 else 0, 0)
        strides = tuple((0, case.cols if case.rows > 1 else 0, 1) if name in ("x", "grad") else per_position
                        for name in variants.loss_row_tensors(case.direction))
        view = RowView(1, case.rows, case.cols, strides)
        calls = []
        for form, flags in LOSS_FORMS[case.direction].items():
            options = loss_plan_options(case, form)
            facts = variants.LossFacts(acc_fp64=case.dtype == "float64", wait_atomic=target.tuning.split_wait_atomic,
                                       **flags)
            calls.append(("loss", launch_plan.LossCall(case.direction, view, facts, (-100,), case.input_bytes,
                                                       options["splittable"], options["align"],
                                                       record.cooperative_launch), view))
        return calls
    fusion = Fusion(FUSED_FORM["scale"], FUSED_FORM["mask"], case.causal, _fused_scalars(case)) if case.fused else None
    view = RowView(1, case.rows, case.cols, tuple(case.tensor_strides))
    return [("softmax", launch_plan.softmax_call(target, case.direction, view, [size] * len(case.tensor_strides),
                                                 True, case.log, case.dtype == "float64", fusion=fusion), view)]


@pytest.mark.parametrize("table", _shipped(), ids=lambda t: f"{t.backend}-{t.arch}-triton-{t.triton}")
def test_the_tables_hold_every_variant_their_cases_weigh(table):
    """Planning each case a table was compiled for asks only for variants it holds, so that a
    first call of such a case compiles one variant per launch (the check finds its numbers)."""
    record, _, _ = target_record(parse_target(f"{table.backend}:{table.arch.replace('sm_', '')}"))
    target = target_for(record)
    missing = set()

    def known(dtype):
        def lookup(variant):
            key = variant.key(dtype)
            if table.get(key) is None:
                missing.add(key)
            return table.nearest(key) or KernelResources(64, 0, variant.option_values["num_warps"])
        return lookup
    cases = [Case(**fields) for fields in table.cases]
    assert cases, "a table names the cases it was compiled for"
    for case in cases:
        if case.sharded:
            continue  # planned without resources (launch.run_sharded)
        lookup = known(case.dtype)
        for kind, call, view in _case_calls(record, case):
            if kind == "loss":
                launch_plan.plan_cross_entropy(target, call, lookup, lookup)
            else:
                launch_plan.plan_softmax(target, call, lookup, lookup)
    assert not missing, f"{len(missing)} variants weighed but not in the table, e.g. {sorted(missing)[:3]}"


def _h200_loss_plan(table: ResourceTable, rows: int, cols: int, dtype: str = "bfloat16", counted: bool = True,
                    align: int = 1):
    """The H200's plan of a 'mean' cross-entropy that writes its gradient (without ``counted``: a
    'sum'), from ``table`` alone (as ``portable-softmax warmup --profile h200`` plans), its rows
    read through windows of ``align``: (plan, launched variants)."""
    target = target_for(H200)
    strides = tuple((0, cols, 1) if name in ("x", "grad") else (0, 1, 0)
                    for name in variants.loss_row_tensors("forward"))
    facts = variants.LossFacts(acc_fp64=False, write_grad=True, wait_atomic=target.tuning.split_wait_atomic,
                               counted=counted, summed=True)
    size = 2 if dtype == "bfloat16" else 4
    call = launch_plan.LossCall("forward", RowView(1, rows, cols, strides), facts, (-100,), size, True, align,
                                H200.cooperative_launch)
    known = launch_plan.known_resources(target, table, dtype, True, size)
    return launch_plan.plan_cross_entropy(target, call, known, known)


def test_a_capped_variant_the_table_lacks_takes_its_uncapped_row():
    """A variant under a register cap that the table lacks is known as its uncapped row, the
    registers above the cap spilled, where that spills less than the estimate. The estimate
    counts a thread's elements twice for the forward that writes the gradient: float32 split rows
    in chunks of 8192 (103 registers uncapped) took 64 spilled words under the cap of 96 that fits
    5 programs an SM, so the H200 ran them at 4; their binary spills none under it, and 5 read
    2-3% faster forward + backward on all six bench shapes (NOTES v50, Triton 3.6). The forward
    alone's streamed windows keep the estimate (fewer spills than their uncapped row's excess:
    taken instead, it moved them from 5 programs an SM to 4, 3% slower)."""
    (table,) = [t for t in _shipped() if (t.backend, t.arch, t.triton) == ("cuda", "sm_90", "3.6.0")]
    for rows, cols in ((8192, 32000), (4096, 53248), (4096, 256000)):
        plan, launched = _h200_loss_plan(table, rows, cols, "float32")
        assert (plan.block_n, plan.num_warps, plan.occupancy) == (8192, 4, 5), (rows, cols)
        assert [v.option_values.get("maxnreg") for v in launched] == [96]
    target = target_for(H200)
    variant = launched[0]
    uncapped = dataclasses.replace(variant, options=tuple(o for o in variant.options if o[0] != "maxnreg"))
    only_uncapped = ResourceTable("cuda", "sm_90", "3.6.0", {uncapped.key("float32"): KernelResources(103, 0, 4, 2)})
    known = launch_plan.known_resources(target, only_uncapped, "float32", True, 4)
    assert (known(variant).registers, known(variant).spills) == (96, 2 + 7)
    assert known(uncapped) == KernelResources(103, 0, 4, 2)
    # Neither row, or an uncapped row further over the cap than the estimate: the estimate.
    estimated = launch_plan.known_resources(target, ResourceTable("cuda", "sm_90", "3.6.0", {}), "float32", True, 4)
    assert estimated(variant).registers == 96 and 8 < estimated(variant).spills < 200 - 96
    far = ResourceTable("cuda", "sm_90", "3.6.0", {uncapped.key("float32"): KernelResources(200, 0, 4, 0)})
    assert launch_plan.known_resources(target, far, "float32", True, 4)(variant) == estimated(variant)


def test_split_rows_of_a_length_the_table_lacks_plan_from_rows_of_other_lengths():
    """A row of 7 chunks of 8192 (53248 classes) has no row of its own in the tables, which hold
    the bench's shapes. Its resources are those of the rows of 4 chunks (NOTES v48: 127 and 128
    registers under the cap of 128, no spill), not an estimate whose registers grow with a
    thread's elements (160 uncapped, 32 words spilled under every cap): planned from the
    estimate, it ran uncapped at 3 programs an SM, 0.73-0.80 of the floor on the H200 against
    0.83-0.87 at 4 under the cap (v48, rows of 49152 to 100352)."""
    table = _h100_table()
    short, _ = _h200_loss_plan(table, 8192, 32000)
    plan, launched = _h200_loss_plan(table, 4096, 53248)
    assert short.chunks == 4 and plan.chunks == 7 and plan.block_n == short.block_n == 8192
    assert plan.occupancy == short.occupancy == 4
    assert [v.option_values.get("maxnreg") for v in launched] == [128]


def _h200_forward_plan(rows: int, cols: int) -> LaunchPlan:
    """The H200's plan of the forward of a bf16 cross-entropy call that writes its gradient, as
    ``portable-softmax warmup --profile h200 --loss --backward`` plans it from the H100 table."""
    from portable_softmax.warmup import plan_call, warmup_calls

    call = [c for c in warmup_calls([(rows, cols)], ["bfloat16"], [-1], log=False, backward=True, loss=True)
            if c.function == "cross_entropy"][0]
    return next(p.plan for p in plan_call(target_for(H200), _h100_table(), call) if p.what == "forward")


@pytest.mark.parametrize("cols", [32001, 128257])
def test_cuda_loss_rows_read_through_windows_take_chunks_of_4096(cols):
    """bf16 rows off 16-byte boundaries that write their gradient run unpipelined through
    windows: in chunks of 4096 at 2 warps, 10 programs an SM, as 4096x50257's, not of 8192 at 3
    (``Tuning.loss_window_chunk``; NOTES v48, H200: 8192x32001 0.60 -> 0.74 of the floor,
    8192x128257 0.57 -> 0.74). The aligned rows keep chunks of 8192."""
    odd, aligned = _h200_forward_plan(8192, cols), _h200_forward_plan(8192, cols - 1)
    assert odd.align > 1 and (odd.block_n, odd.num_warps, odd.num_stages, odd.occupancy) == (4096, 2, 1, 10)
    assert aligned.align == 1 and aligned.block_n == 8192


@pytest.mark.parametrize("rows, cols", [(4096, 50304), (8192, 50304), (4096, 57600)])
def test_cuda_aligned_loss_rows_keep_chunks_of_8192(rows, cols):
    """Aligned bf16 rows whose last chunk of 8192 pads 12% (50304 in 7) write their gradient in
    chunks of 8192 at 4 warps, 4 programs an SM, pipelined, not halved to 4096 at 6 an SM
    (``Tuning.loss_max_padding``; NOTES v49, H200: 4096x50304 0.250 -> 0.241 ms forward +
    backward, 4096x57600 0.288 -> 0.272). Rows through windows keep their chunks of 4096."""
    plan = _h200_forward_plan(rows, cols)
    assert plan.align == 1 and (plan.block_n, plan.num_warps, plan.num_stages, plan.occupancy) == (8192, 4, 3, 4)
    assert _h200_forward_plan(rows, 50257).block_n == 4096


@pytest.mark.parametrize("cols, chunks", [(28671, 8), (32767, 9), (49151, 13)])
def test_cuda_loss_rows_a_few_columns_short_of_whole_chunks_take_windows_unhalved(cols, chunks):
    """bf16 rows a few columns short of whole chunks of 4096 write their gradient through windows,
    a chunk more for the window's last columns, not unwindowed an element an instruction (NOTES
    v51, H200, forward + backward graph-timed: 4096x49151 0.392 -> 0.247 ms) nor in halved chunks
    of 2048 (``Tuning.loss_max_padding``; 8192x28671 0.402 -> 0.293)."""
    plan = _h200_forward_plan(8192, cols)
    assert plan.align > 1 and (plan.block_n, plan.chunks, plan.num_warps) == (4096, chunks, 2)


@pytest.mark.parametrize("table", [t for t in _shipped() if t.backend == "cuda"],
                         ids=lambda t: f"{t.backend}-{t.arch}-triton-{t.triton}")
def test_a_sum_the_table_lacks_is_planned_as_the_mean_not_as_every_option(table):
    """A reduced 'sum' (the grid sums the loss, counts nothing) has no row of its own: its nearest
    form is the 'mean''s, one constexpr apart, not the every-option form's, whose 80 spilled words
    at 2 warps once sent it to 4 warps and 4 programs an SM where the 'mean' runs 10 (H200, bf16
    4096x50257: 0.430 ms against 0.252 forward + backward, NOTES v52)."""
    for rows, cols, align in ((4096, 50257, 8), (8192, 32000, 1), (4096, 151936, 1)):
        mean, _ = _h200_loss_plan(table, rows, cols, align=align)
        total, _ = _h200_loss_plan(table, rows, cols, counted=False, align=align)
        assert (total.regime, total.num_warps, total.occupancy, total.programs) == (
            mean.regime, mean.num_warps, mean.occupancy, mean.programs), (total.reason, mean.reason)


def test_a_variant_the_table_lacks_takes_no_neighbour_with_options_it_leaves_off():
    """A neighbour row is a guess: one with more of the loss's options (weights, smoothing,
    z-loss, softcap) holds more registers and spills, and a plan from it refuses grids its own
    binary fits (H200, bf16 4096x50257 smoothing under the cap of 6 an SM: the every-option
    form's row spills 204 words, its binary none, NOTES v52); one with fewer is checked by the
    compile (``plan_checked``). So a key takes the nearest neighbour whose options are among its
    own, and an estimate (None here) where there is none."""
    def key(**constexprs):
        flags = {"WEIGHT": 0, "SMOOTHING": 0, "Z_LOSS": 0, "SOFTCAP": 0, "COUNTED": 1, "SUMMED": 1, **constexprs}
        listed = " ".join(f"{name}={value}" for name, value in sorted(flags.items()))
        return f"cross_entropy_forward_split *bf16 args=iiD BLOCK_N=4096 {listed} | maxnreg=168 num_warps=2"
    every = KernelResources(168, 32, 2, 204)
    mean = KernelResources(160, 32, 2, 0)
    table = ResourceTable("cuda", "sm_90", "3.6.0", {key(WEIGHT=1, SMOOTHING=1, Z_LOSS=1, SOFTCAP=1, COUNTED=0): every})
    assert table.nearest(key(SMOOTHING=1)) is None
    assert table.nearest(key(WEIGHT=1, SMOOTHING=1, Z_LOSS=1, SOFTCAP=1)) == every
    table = ResourceTable("cuda", "sm_90", "3.6.0", {key(WEIGHT=1, SMOOTHING=1, Z_LOSS=1, SOFTCAP=1, COUNTED=0): every,
                                                    key(): mean})
    assert table.nearest(key(SMOOTHING=1)) == mean
    assert table.nearest(key(COUNTED=0)) == mean  # a 'sum'
