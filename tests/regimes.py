"""Forcing a regime on small problems, for the tests of every regime (shared by test modules)."""
from __future__ import annotations

import pytest

import portable_softmax as ps
from portable_softmax import launch, tuning


def force_regime(monkeypatch, regime: str, device: str) -> None:
    """Shrink the current backend's tuning so small problems take ``regime``."""
    record = ps.device_info(device)
    if regime in ("split", "ticketed", "pipelined") and not record["residency_guaranteed"]:
        pytest.skip(f"{record['backend']} cannot guarantee residency: no split path there")
    key = (record["backend"], "*")
    base = tuning.TUNING[key]
    split = dict(row_elements=64, split_chunk=128, split_min_cols=1 << 30, split_tickets=frozenset(),
                 split_pipelined=frozenset())
    small = {"tile": dict(tile_elements=256),
             "split": split,
             "ticketed": {**split, "split_tickets": frozenset({"forward", "backward"}), "split_ticket_bytes": 0,
                          "split_ticket_waves": 0},
             # One resident program per unit: each then takes several items, the pipeline's steady
             # state. Pipelined however few its items, and rows off 16-byte boundaries (which the
             # plan reads through windows, unpipelined) read element by element.
             "pipelined": {**split, "split_pipelined": frozenset({"forward", "backward"}), "split_programs_per_unit": 1,
                           "split_pipeline_items": 0, "split_windows": frozenset()},
             "loop": dict(row_elements=64, loop_chunk=128)}[regime]
    monkeypatch.setitem(tuning.TUNING, key, tuning.replace(base, **small))
    if regime == "loop":
        real_plan = launch.plan_launch
        monkeypatch.setattr(launch, "plan_launch", lambda *a, **k: real_plan(*a, **{**k, "allow_split": False}))


def regime_of(plan: launch.LaunchPlan) -> str:
    if plan.ticketed:
        return "ticketed"
    return "pipelined" if plan.regime == "split" and plan.num_stages > 1 else plan.regime
