"""``portable-softmax warmup``: on a CPU (Triton's interpreter) and for a recorded chip it plans each
call and lists what would compile, compiling nothing; on a GPU it makes each call once, so that a
later process finds the kernels in Triton's cache (``benchmarks/device.sh firstcall`` shows it)."""
from __future__ import annotations

import json

import pytest

from portable_softmax import cli, launch, warmup


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
    # softmax forward and backward, the loss's forward and its gradient's rescale
    assert len(lines) == 4 and all(line.rstrip().endswith("nothing to compile") for line in lines)
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
    assert split["kernels"][0]["resources"] in (warmup.IN_TABLE, warmup.ESTIMATED)
    # A column softmax of 32768 rows over dim 0: rows side by side, sliced in two launches.
    column = launches[("softmax 32768x1024 bfloat16 dim 0 forward+backward", "forward")]
    assert [k["kernel"] for k in column["kernels"]] == ["softmax_forward_partials", "softmax_forward_normalize"]
    scale = launches[("cross_entropy 4096x50257 bfloat16 forward+backward", "gradient scale")]
    assert scale["kernels"] == [{"kernel": "cross_entropy_grad_scale", "resources": warmup.UNSIZED}]


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
