"""Forcing a regime on small problems, for the tests of every regime (shared by test modules)."""
from __future__ import annotations

import pytest
from packaging.version import Version

import portable_softmax as ps
from portable_softmax import compat, launch, launch_plan, tuning

# The regimes whose programs trade partials through the exchange (``kernels.exchange``).
SPLIT_REGIMES = ("split", "ticketed", "pipelined")


def interpreted(device: str) -> bool:
    """Whether ``device``'s kernels run through Triton's interpreter (CPU tensors). There each
    (row, chunk) item of a split launch is interpreted twice, once in each launch of its
    exchange, at 50 to 100 ms an item on a CI machine: the tests of the split regimes take a few
    rows there."""
    return ps.device_info(device)["backend"] == "interpreter"


def open_split(device: str, **changes) -> dict:
    """What a tuning row needs for the split path to be planned on ``device``: nothing where it
    promises residency; on the interpreter, the exchange in two launches
    (``Tuning.split_two_launches``), and with ``ticketed`` a program per item however many (the
    interpreter's grid is capped at ``Tuning.max_programs``, 4, otherwise). Skips elsewhere, and
    ticketed grids on Triton 3.2's interpreter: its ``tl.store`` tests ``not mask`` (3.4 tests
    ``mask is None``), which the interpreter answers with a scalar mask's value, so that a false
    one stores anyway, and the ticket counter that a grid's last program resets is reset by every
    program."""
    record = ps.device_info(device)
    if record["residency_guaranteed"]:
        return changes
    if record["backend"] != "interpreter":
        pytest.skip(f"{record['backend']} cannot guarantee residency: no split path there")
    ticketed = bool(changes.get("split_tickets", tuning.TUNING[(record["backend"], "*")].split_tickets))
    if ticketed and compat.TRITON_VERSION < Version("3.4"):
        pytest.skip(f"Triton {compat.TRITON_VERSION}'s interpreter stores through a scalar pointer whatever its mask: "
                    f"ticketed grids need 3.4 or newer there")
    return {**changes, "split_two_launches": True, **({"max_programs": 2**31 - 1} if ticketed else {})}


def force_regime(monkeypatch, regime: str, device: str) -> None:
    """Shrink the current backend's tuning so small problems take ``regime`` (the split regimes
    through ``open_split``)."""
    record = ps.device_info(device)
    key = (record["backend"], "*")
    base = tuning.TUNING[key]
    # The loss's forward alone too (the CUDA rows stream it by default).
    split = dict(row_elements=64, split_chunk=128, split_min_cols=1 << 30, split_tickets=frozenset(),
                 split_pipelined=frozenset(), loss_split=frozenset({"gradient", "loss"}))
    small = {"tile": dict(tile_elements=256),
             "split": split,
             "ticketed": {**split, "split_tickets": frozenset({"forward", "backward"}), "split_ticket_bytes": 0,
                          "split_ticket_waves": 0},
             # One resident program per unit: each then takes several items, the pipeline's steady
             # state. Pipelined however few its items, and rows off 16-byte boundaries (which the
             # plan reads through windows, unpipelined) read element by element.
             "pipelined": {**split, "split_pipelined": frozenset({"forward", "backward"}), "split_programs_per_unit": 1,
                           "split_pipeline_items": 0, "split_windows": frozenset()},
             "loop": dict(row_elements=64, loop_chunk=128, loss_alone_chunk=0, loss_split=frozenset())}[regime]
    if regime in SPLIT_REGIMES:
        small = open_split(device, **small)
    monkeypatch.setitem(tuning.TUNING, key, tuning.replace(base, **small))
    if regime == "loop":
        real_plan = launch_plan.plan_launch
        monkeypatch.setattr(launch_plan, "plan_launch", lambda *a, **k: real_plan(*a, **{**k, "allow_split": False}))


def regime_of(plan: launch.LaunchPlan) -> str:
    if plan.arrival:
        return "arrival"
    if plan.ticketed:
        return "ticketed"
    return "pipelined" if plan.regime == "split" and plan.num_stages > 1 else plan.regime
