"""Backend plugins through the ``portable_softmax.backends`` entry-point group.

The plugin is installed the way pip would leave it: a module and a ``*.dist-info`` folder with an
``entry_points.txt`` on ``sys.path``, found by ``importlib.metadata`` itself (nothing is patched in
the loader). Its backend serves CPU tensors through Triton's interpreter under its own name, with
its own normalize and occupancy functions, so a softmax on the CPU can be seen to run through it.
"""
from __future__ import annotations

import sys
import textwrap

import pytest
import torch

import portable_softmax as ps
from portable_softmax import backend, device, launch

PLUGIN_MODULE = "fakeaccel_softmax_plugin"

PLUGIN_SOURCE = textwrap.dedent('''
    """A fake accelerator backend: CPU tensors, run through Triton's interpreter."""
    from portable_softmax import Backend, DeviceRecord

    normalize_calls = []
    occupancy_calls = []


    def normalize(raw, arch, name):
        normalize_calls.append((dict(raw), arch, name))
        return DeviceRecord(
            backend="fakeaccel", name="Fake Accelerator", arch="fake1", warp_size=1, compute_units=3,
            registers_per_unit=None, shared_memory_per_unit=None, max_threads_per_unit=None,
            max_programs_per_unit=1, grid_limit=65535, supports_fp64=True, supports_bf16=True,
            # The interpreter runs programs one after another: no residency.
            residency_guaranteed=False,
        )


    def occupancy(record, resources):
        occupancy_calls.append((record, resources))
        return 1


    def make_backend():
        return Backend("fakeaccel", "", "cpu", normalize, occupancy, interpreted=True)
''')

ENTRY_POINTS = textwrap.dedent(f'''
    [portable_softmax.backends]
    fakeaccel = {PLUGIN_MODULE}:make_backend
    broken = {PLUGIN_MODULE}:no_such_attribute
''')


def _reset() -> None:
    backend.unregister_backend("fakeaccel")
    backend.unregister_backend("broken")
    backend._plugins_loaded = False
    device._record.cache_clear()
    sys.modules.pop(PLUGIN_MODULE, None)


@pytest.fixture
def plugin(tmp_path, monkeypatch):
    """The fake plugin installed on sys.path; the registry is as before when the test ends."""
    (tmp_path / f"{PLUGIN_MODULE}.py").write_text(PLUGIN_SOURCE)
    dist_info = tmp_path / "fakeaccel_softmax_plugin-0.1.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text("Metadata-Version: 2.1\nName: fakeaccel-softmax-plugin\nVersion: 0.1\n")
    (dist_info / "entry_points.txt").write_text(ENTRY_POINTS)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delenv(backend.BACKEND_ENV, raising=False)
    _reset()
    yield tmp_path
    _reset()


def test_plugin_is_discovered_through_entry_points(plugin, caplog):
    assert "fakeaccel" not in backend._REGISTRY
    with caplog.at_level("ERROR", logger=backend.__name__):
        backends = ps.registered_backends()
    assert backends["fakeaccel"].torch_device_type == "cpu" and backends["fakeaccel"].interpreted
    # A broken entry is logged and skipped, not fatal.
    assert "broken" not in backends
    assert any("broken" in record.getMessage() for record in caplog.records)
    # Built-ins are still there.
    assert {"cuda", "hip", "npu", "interpreter"} <= set(backends)


def test_forced_plugin_runs_softmax(plugin, monkeypatch):
    monkeypatch.setenv(backend.BACKEND_ENV, "fakeaccel")
    x = torch.randn(5, 37)

    info = ps.device_info("cpu")
    assert info["backend"] == "fakeaccel"
    assert info["name"] == "Fake Accelerator" and info["compute_units"] == 3

    module = sys.modules[PLUGIN_MODULE]
    assert module.normalize_calls == [({}, "cpu", "")]
    assert module.occupancy_calls == []

    used = []
    run = launch._run

    def spy(kernel, backend_, plan, *args):
        used.append((backend_.name, plan.backend))
        return run(kernel, backend_, plan, *args)

    monkeypatch.setattr(launch, "_run", spy)
    y = ps.softmax(x, dim=-1)
    torch.testing.assert_close(y, torch.softmax(x, dim=-1))
    assert used == [("fakeaccel", "fakeaccel")]
    assert module.occupancy_calls, "the planner did not ask the plugin's occupancy"
    record, resources = module.occupancy_calls[-1]
    assert record.backend == "fakeaccel" and resources.num_warps >= 1

    # Backward, too.
    x.requires_grad_()
    z = ps.log_softmax(x, 0)
    z.backward(torch.ones_like(z))
    reference = x.detach().clone().requires_grad_()
    torch.log_softmax(reference, 0).backward(torch.ones_like(z))
    torch.testing.assert_close(x.grad, reference.grad)
    assert [name for name, _ in used] == ["fakeaccel"] * 3


def test_unknown_forced_backend_lists_known_ones(plugin, monkeypatch):
    monkeypatch.setenv(backend.BACKEND_ENV, "nosuch")
    with pytest.raises(ValueError) as error:
        ps.softmax(torch.randn(2, 3))
    message = str(error.value)
    assert "PORTABLE_SOFTMAX_BACKEND='nosuch'" in message
    known = message.split("known backends:")[1]
    for name in ("cuda", "hip", "interpreter", "npu", "fakeaccel"):
        assert name in known
    with pytest.raises(ValueError, match="known backends"):
        ps.device_info("cpu")


def test_registry_is_restored_after_a_plugin_test():
    # Runs after the tests above in file order: nothing of the plugin is left behind.
    assert "fakeaccel" not in ps.registered_backends()
    assert ps.device_info("cpu")["backend"] == "interpreter"


def test_a_plugin_brings_its_own_tuning():
    """A backend's own rows (``Backend(tuning=...)``) are what its records plan with, where the
    table has none; the table wins where it has one."""
    import dataclasses

    from portable_softmax import tuning
    from portable_softmax.backend import register_backend, unregister_backend
    from portable_softmax.record import DeviceRecord
    from portable_softmax.targets import plan_launch

    own = tuning.replace(tuning.Tuning(), tile_elements=4096)
    interpreter = ps.get_backend("interpreter")
    register_backend(dataclasses.replace(interpreter, name="tuned", tuning={"*": own}))
    try:
        record = DeviceRecord("tuned", "tuned cpu", "cpu", 1, 4, None, None, None, 1, 2**31 - 1, True, True, False)
        assert tuning.tuning_for(record) is own
        assert plan_launch(record, 64, 256, "float32").block_m == 16  # 4096 elements a tile, rows of 256
        tuning.TUNING[("tuned", "*")] = tuning.Tuning()
        assert tuning.tuning_for(record) == tuning.Tuning()
    finally:
        tuning.TUNING.pop(("tuned", "*"), None)
        unregister_backend("tuned")
