"""The command line, run in-process: global options before or after the command, and every
mistake answered by one line, ``portable-softmax: error: ...`` (exit 2), never a traceback."""
from __future__ import annotations

import importlib.util
import json

import pytest
import torch
import triton.backends

from portable_softmax import cli, crosscompile, validate
from portable_softmax.planner import DTYPE_BYTES
from portable_softmax.profiles import profile_names, profile_record


def _run(argv: list[str], capsys: pytest.CaptureFixture) -> tuple[int, str, str]:
    try:
        code = cli.main(argv)
    except SystemExit as exit_info:
        code = exit_info.code
    out, err = capsys.readouterr()
    return code, out, err


def _assert_one_line_error(argv: list[str], capsys: pytest.CaptureFixture, *needles: str) -> str:
    code, _, err = _run(argv, capsys)
    assert "Traceback" not in err, err
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("portable-softmax: error: "), (code, err)
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def _absent(device_type: str) -> bool:
    module = getattr(torch, device_type, None)
    return module is None or not module.is_available()


@pytest.mark.parametrize("before", [True, False], ids=["before", "after"])
def test_global_options_before_or_after_the_command(before, capsys):
    options = ["--device", "cpu", "-v"]
    argv = [*options, "info", "--json"] if before else ["info", "--json", *options]
    code, out, err = _run(argv, capsys)
    assert code == 0 and "Traceback" not in err
    assert json.loads(out)["backend"] == "interpreter"


def test_an_option_after_the_command_does_not_undo_one_before(capsys):
    # The command's copy of --device defaults to nothing, so the one given first stands.
    code, out, _ = _run(["--device", "cpu", "plan", "--shape", "4x8", "--json"], capsys)
    assert code == 0 and json.loads(out)["device"]["backend"] == "interpreter"


@pytest.mark.skipif(not _absent("cuda"), reason="a CUDA device is present")
@pytest.mark.parametrize("argv", [["--device", "cuda", "info"], ["info", "--device", "cuda:0"],
                                  ["plan", "--shape", "4x8", "--device", "cuda"]])
def test_a_device_this_torch_lacks(argv, capsys):
    _assert_one_line_error(argv, capsys, "cuda")


def test_a_device_index_past_the_last(capsys):
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    _assert_one_line_error(["info", "--device", f"cuda:{count}"], capsys, f"cuda:{count}")


@pytest.mark.skipif(getattr(torch, "npu", None) is not None, reason="torch_npu is loaded")
def test_npu_without_torch_npu(capsys):
    _assert_one_line_error(["--device", "npu", "info"], capsys, "torch_npu")


@pytest.mark.parametrize("text", ["gpu", "cuda:x", ""])
def test_a_device_torch_does_not_know(text, capsys):
    _assert_one_line_error(["info", "--device", text], capsys, "device")


@pytest.mark.parametrize("profile", profile_names())
@pytest.mark.parametrize("dtype", sorted(DTYPE_BYTES))
def test_plan_refuses_what_the_chip_refuses(profile, dtype, capsys):
    """A plan for every recorded chip and dtype exactly where the record allows the dtype (the
    launches ``ops`` refuses there have no plan)."""
    record = profile_record(profile)
    allowed = {"float64": record.supports_fp64, "bfloat16": record.supports_bf16}.get(dtype, True)
    argv = ["plan", "--profile", profile, "--shape", "64x1000", "--dtype", dtype]
    if allowed:
        code, out, err = _run(argv, capsys)
        assert code == 0 and record.name in out, err
    else:
        _assert_one_line_error(argv, capsys, dtype, "not supported")


@pytest.fixture
def no_compiles(monkeypatch):
    """Fails a test whose command line gets as far as compiling."""
    def refuse(*_args, **_kwargs):
        raise AssertionError("the target should have been refused before any compile")

    monkeypatch.setattr(crosscompile.report, "run", refuse)  # where run_command looks it up


def _have(backend: str) -> bool:
    return {"cuda": "nvidia", "hip": "amd"}[backend] in triton.backends.backends


@pytest.mark.skipif(not _have("cuda"), reason="no NVIDIA backend in this Triton")
@pytest.mark.parametrize("text", ["cuda:999", "cuda:95", "cuda:88"])
def test_a_cuda_target_triton_cannot_compile_for(text, capsys, no_compiles):
    """cuda:999 was accepted, and then every compile aborted (exit code -6). Triton 3.6+ lists the
    capabilities it compiles for; 3.2 is asked with a compile, and says it cannot."""
    line = _assert_one_line_error(["compile", "--target", text, "--shape", "4x1024", "--dtype", "float32"], capsys,
                                  text)
    assert "compute capabilities" in line or "cannot compile for it" in line, line


@pytest.mark.skipif(not _have("hip"), reason="no AMD backend in this Triton")
def test_a_hip_target_triton_cannot_compile_for(capsys, no_compiles):
    _assert_one_line_error(["compile", "--target", "hip:gfx999", "--shape", "4x1024", "--dtype", "float32"], capsys,
                           "hip:gfx999", "unsupported target")


@pytest.mark.parametrize("text", ["cuda:80", "cuda:90", "hip:gfx942", "hip:gfx1100=rx7900xtx"])
def test_targets_triton_compiles_for_are_taken(text, capsys, monkeypatch):
    if not _have(text.split(":")[0]):
        pytest.skip(f"no backend for {text} in this Triton")
    taken = []
    monkeypatch.setattr(crosscompile, "run_command", lambda args: taken.extend(args.target) or 0)
    code, _, err = _run(["compile", "--target", text], capsys)
    assert code == 0 and [t.name for t in taken] == [text.split("=")[0]], err


@pytest.mark.parametrize("argv", [
    ["info", "--bogus"],
    ["plan", "--shape", "axb"],
    ["plan", "--shape", "4x8", "--profile", "no-such-chip"],
    ["plan"],
    ["frobnicate"],
    ["bench", "--device", "cpu", "--M", "4", "--N", "8"],
    ["bench", "--device", "cpu", "--cases", "real"],
    ["bench", "--device", "cpu", "--cases", "all", "--small"],  # the rows need a GPU
    ["bench", "--cases", "some"],
])
def test_other_mistakes_are_one_line(argv, capsys):
    _assert_one_line_error(argv, capsys)


def test_an_unwritable_report_folder_is_one_line(tmp_path, capsys, monkeypatch):
    """Before any check runs: a report that cannot be written is known before minutes of checks."""
    checked = []
    monkeypatch.setattr(validate.selfcheck, "check_case", lambda *args: checked.append(args) or [])
    occupied = tmp_path / "a-file"
    occupied.write_text("")
    _assert_one_line_error(["validate", "--device", "cpu", "--no-bench", "--out", str(occupied)], capsys,
                           str(occupied))
    assert not checked, "validate ran its checks before it made its report folder"


def test_real_use_cases_through_the_command_line_on_the_interpreter(tmp_path, capsys):
    """``bench --cases real --small`` on the CPU: every case's stand-in is checked against torch
    (ours right forward, backward op and through autograd), timed by the host's clock, and the
    table, JSON and plot are written."""
    from portable_softmax import bench_cases

    code, out, err = _run(["bench", "--device", "cpu", "--cases", "real", "--small", "--peers", "torch",
                           "--out", str(tmp_path)], capsys)
    assert code == 0, err
    (written,) = tmp_path.glob("real-*.json")
    rows = json.loads(written.read_text())["results"]
    assert {(r["case"], r["dtype"]) for r in rows} == {(c.name, str(c.dtype)[6:]) for c in bench_cases.CASES}
    assert {r["impl"] for r in rows} == {"ours", "torch"}
    ours = [r for r in rows if r["impl"] == "ours"]
    assert all(r["fwd_err"] < 2e-2 and r["bwd_err"] < 2e-2 and r["autograd_err"] < 2e-2 and "autograd_frac" in r
               and "wrong" not in r and "error" not in r for r in ours), ours
    table = [line for line in out.splitlines() if line.startswith("| ") and "---" not in line][1:]
    assert len(table) == len(bench_cases.CASES) and "| transposed (4096, 8192).t() | bfloat16 |" in out
    assert not [line for line in table if "WRONG" in line or "fail" in line] and "wrong or failed" not in out
    if importlib.util.find_spec("matplotlib") is not None:
        assert written.with_suffix(".png").exists()


def test_real_use_cases_of_the_dtypes_asked(tmp_path, capsys, monkeypatch):
    """``--dtype`` picks the real cases of those dtypes."""
    from portable_softmax import bench_cases

    monkeypatch.setattr(bench_cases, "CASES", [c for c in bench_cases.CASES if "router" in c.name])
    code, _, err = _run(["bench", "--device", "cpu", "--cases", "real", "--small", "--dtype", "float32",
                         "--peers", "torch", "--out", str(tmp_path)], capsys)
    assert code == 0, err
    rows = json.loads(next(tmp_path.glob("real-*.json")).read_text())["results"]
    assert {r["dtype"] for r in rows} == {"float32"}


def test_a_wrong_result_is_reported_not_timed(monkeypatch):
    """A result outside the tolerance is marked wrong in the table and never timed."""
    from portable_softmax import bench_cases

    monkeypatch.setattr(bench_cases, "CASES", [c for c in bench_cases.CASES if c.name.startswith("router")][-1:])
    monkeypatch.setattr(bench_cases.portable_softmax, "softmax", lambda x, dim: torch.softmax(x, dim) * 1.1)
    results = bench_cases.run({"torch"}, "cpu", small=True, timer=lambda fn: 1.0)
    (ours,) = [r for r in results["results"] if r["impl"] == "ours"]
    assert "wrong" in ours and "fwd_ms" not in ours and "fwd_frac" not in ours
    assert "WRONG" in bench_cases.table(results) and "ours on router rows" in bench_cases.table(results)


def test_peers_of_rows_serve_only_rows():
    from portable_softmax import bench_cases

    serve = bench_cases._rows_peer(lambda x: x, None)
    assert serve(torch.randn(2, 3, 4), -1, {}) is not None
    assert serve(torch.randn(4, 3).t(), -1, {}) is None and serve(torch.randn(2, 3, 4), 1, {}) is None
    assert serve(torch.randn(2, 3, 4), -1, {"causal": True}) is None


def test_validate_and_bench_say_where_they_write(tmp_path, capsys, monkeypatch):
    """A relative ``--out`` (the default is one) is named as the absolute folder written."""
    from portable_softmax import bench_cases

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(validate, "CONFORMANCE", [((4, 8), torch.float32)])
    monkeypatch.setattr(validate, "FUSED", validate.FUSED[:1])
    code, out, err = _run(["validate", "--device", "cpu", "--no-bench", "--out", "report"], capsys)
    assert code == 0, err
    assert out.strip().splitlines()[-1] == f"wrote report.md, report.json in {tmp_path.resolve() / 'report'}"
    monkeypatch.setattr(bench_cases, "CASES", [c for c in bench_cases.CASES if "router" in c.name][:1])
    code, out, err = _run(["bench", "--device", "cpu", "--cases", "real", "--small", "--dtype", "float32",
                           "--peers", "torch", "--out", "results"], capsys)
    assert code == 0, err
    (written,) = (tmp_path / "results").glob("real-*.json")
    assert out.strip().splitlines()[-1].startswith(f"wrote {written.resolve()}")


@pytest.mark.parametrize("timeout", ["0", "-1", "nan"])
def test_compile_refuses_a_timeout_that_is_not_positive(timeout, capsys):
    _assert_one_line_error(["compile", "--target", "cuda:90", "--timeout", timeout], capsys, "--timeout")


def test_compile_refuses_no_jobs(capsys):
    _assert_one_line_error(["compile", "--target", "cuda:90", "--jobs", "0"], capsys, "--jobs")


def test_a_reader_that_leaves_early_ends_the_command_quietly():
    """``portable-softmax plan ... | head``: the pipe closes before the plan is written; the
    command ends with SIGPIPE's status and no error or traceback."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(cli.__file__).resolve().parent.parent  # this checkout's package first on the path
    with subprocess.Popen([sys.executable, "-m", "portable_softmax", "plan", "--device", "cpu", "--shape", "4x8"],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=root) as process:
        process.stdout.close()  # the reader is gone before anything is written
        err = process.stderr.read().decode()
        status = process.wait(timeout=300)
    assert status == 141 and err == "", err


def test_head_cases_through_the_command_line_on_the_interpreter(tmp_path, capsys, monkeypatch):
    """``bench --cases head --small`` on the CPU: the stand-in head checked against torch in
    float32 (loss and both gradients), timed by the host's clock, its floor and table written."""
    from portable_softmax import bench_head

    monkeypatch.setattr(bench_head, "SMALL_SHAPES", bench_head.SMALL_SHAPES[:1])
    code, out, err = _run(["bench", "--device", "cpu", "--cases", "head", "--small", "--peers", "torch",
                           "--out", str(tmp_path)], capsys)
    assert code == 0, err
    results = json.loads(next(tmp_path.glob("head-*.json")).read_text())
    (floor,) = results["floors"]
    assert floor["target_ms"] == pytest.approx(bench_head.TARGET_FACTOR * (floor["matmul_ms"] + floor["copy_ms"]))
    rows = {row["impl"]: row for row in results["rows"]}
    assert set(rows) == {"ours", "ours-bf16acc", "torch"} and not any("error" in row for row in rows.values())
    assert all(rows["ours"][f"{key}_relerr"] < 1e-2 for key in ("loss", "grad_hidden", "grad_weight")), rows["ours"]
    assert "of target" in out and "\nours " in out


def test_loss_cases_take_one_shape_through_the_command_line(tmp_path, capsys):
    """``bench --cases loss --M --N``: that (tokens, vocabulary) shape alone, checked against torch
    and timed (here on the interpreter, by the host's clock), not the six."""
    code, _, err = _run(["bench", "--device", "cpu", "--cases", "loss", "--small", "--M", "3", "--N", "781",
                         "--dtype", "float32", "--peers", "torch", "--out", str(tmp_path)], capsys)
    assert code == 0, err
    rows = json.loads(next(tmp_path.glob("loss-*.json")).read_text())["rows"]
    assert {(row["N"], row["V"]) for row in rows} == {(3, 781)}
    assert {row["impl"] for row in rows} == {"ours", "torch"} and not any("error" in row for row in rows), rows


@pytest.mark.parametrize("case", ["loss", "head"])
def test_the_loss_and_head_benches_warm_the_gpu_before_their_first_case(monkeypatch, case):
    # An idle GPU starts at a low clock: each bench copies for a while before its first case (NOTES
    # v40), on a GPU only (a CPU's interpreter has no clock to raise).
    from portable_softmax import bench_cases, bench_head, bench_loss

    timed = []
    bench_cases.warm_up(torch.device("meta"), lambda fn: timed.append(fn()) or 1.0)
    assert len(timed) == 1 and timed[0].numel() == 1 << 28
    bench_cases.warm_up(torch.device("cpu"), lambda fn: timed.append(fn()) or 1.0)
    assert len(timed) == 1
    order = []
    monkeypatch.setattr(bench_cases, "warm_up", lambda device, timer: order.append("warm"))
    module = bench_loss if case == "loss" else bench_head
    monkeypatch.setattr(module, "_case", lambda *args: order.append("case") or (({}, []) if case == "head" else []))
    module.run(set(), "cpu", small=True, timer=lambda fn: 1.0)
    assert order[0] == "warm" and order.count("warm") == 1 and "case" in order
