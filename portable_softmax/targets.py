"""A device's planning target (``plan_grid.Target``): its record with the tuning row in force and
its backend's occupancy rule, gathered from the registry and the tuning table. And the planner's
functions for a record, for callers that hold a record (the command line, tests, plugins)."""
from __future__ import annotations

from typing import Any, Optional, Union

from portable_softmax import loss_planner, planner, split_planner
from portable_softmax.backend import get_backend
from portable_softmax.plan_grid import KernelConfig, LaunchPlan, Target
from portable_softmax.record import DeviceRecord
from portable_softmax.tuning import tuning_for


def target_for(record: DeviceRecord) -> Target:
    """``record``'s target: the tuning row in force for it and its backend's rules."""
    backend = get_backend(record.backend)
    return Target(record, tuning_for(record), backend.occupancy, backend.fit_options)


def plan_launch(record: DeviceRecord, n_rows: int, n_cols: int, dtype: str, **options: Any) -> LaunchPlan:
    """``planner.plan_launch`` for ``record``'s target."""
    return planner.plan_launch(target_for(record), n_rows, n_cols, dtype, **options)


def plan_loss(record: DeviceRecord, n_rows: int, n_cols: int, dtype: str, **options: Any) -> LaunchPlan:
    """``loss_planner.plan_loss`` for ``record``'s target."""
    return loss_planner.plan_loss(target_for(record), n_rows, n_cols, dtype, **options)


def select_config(record: DeviceRecord, n_rows: int, n_cols: int, dtype: str, **options: Any) -> KernelConfig:
    """``planner.select_config`` for ``record``'s target."""
    return planner.select_config(target_for(record), n_rows, n_cols, dtype, **options)


def split_config(record: DeviceRecord, n_rows: int, n_cols: int, **options: Any) -> KernelConfig:
    """``split_planner.split_config`` for ``record``'s target."""
    return split_planner.split_config(target_for(record), n_rows, n_cols, **options)


def loss_split_form(record: DeviceRecord, n_rows: int, n_cols: int, **options: Any) -> KernelConfig:
    """``loss_planner.split_form`` for ``record``'s target."""
    return loss_planner.split_form(target_for(record), n_rows, n_cols, **options)


def split_fit(record: DeviceRecord, config: KernelConfig, input_bytes: int) -> list[tuple[int, dict[str, Any]]]:
    """``split_planner.split_fit`` for ``record``'s target."""
    return split_planner.split_fit(target_for(record), config, input_bytes)


def tile_fill(record: DeviceRecord, config: KernelConfig, input_bytes: int) -> list[tuple[int, dict[str, Any]]]:
    """``planner.tile_fill`` for ``record``'s target."""
    return planner.tile_fill(target_for(record), config, input_bytes)


def tile_fit(record: DeviceRecord, config: KernelConfig, tiles: int) -> list[tuple[int, dict[str, Any]]]:
    """``planner.tile_fit`` for ``record``'s target."""
    return planner.tile_fit(target_for(record), config, tiles)


def ticketed_forms(record: DeviceRecord, config: KernelConfig, n_cols: int, backward: bool,
                   input_bytes: int, per_thread: Optional[int] = None) -> list[KernelConfig]:
    """``split_planner.ticketed_forms`` for ``record``'s target."""
    return split_planner.ticketed_forms(target_for(record), config, n_cols, backward, input_bytes, per_thread)


def dense_form(record: DeviceRecord, plan: Union[LaunchPlan, KernelConfig], n_rows: int, n_cols: int,
               rows_per_group: int, narrow: bool, backward: bool) -> bool:
    """``planner.dense_form`` for ``record``'s target."""
    return planner.dense_form(target_for(record), plan, n_rows, n_cols, rows_per_group, narrow, backward)


def flat_form(record: DeviceRecord, plan: Union[LaunchPlan, KernelConfig], n_rows: int, rows_per_group: int,
              narrow: bool, backward: bool) -> bool:
    """``planner.flat_form`` for ``record``'s target."""
    return planner.flat_form(target_for(record), plan, n_rows, rows_per_group, narrow, backward)
