"""The README's Python examples run as written, on CPU.

Every ```python block of README.md is one example: it is executed on its own, in a fresh namespace
(so each must define every name it uses), from an empty folder. A block that raises fails its
test. The blocks are the README's; there is no list here to keep in step with it, but there must be
at least ``MIN_BLOCKS`` of them, so a README whose fences were renamed cannot pass by running nothing.
"""
from __future__ import annotations

import re
import socket
from pathlib import Path

import pytest

README = Path(__file__).resolve().parent.parent / "README.md"
# The README's examples: the first call, the fused terms, the loss, enable(), sharded dimensions.
MIN_BLOCKS = 5
FENCE = re.compile(r"^```python\n(.*?)^```\n", re.MULTILINE | re.DOTALL)


def readme_blocks() -> list[tuple[int, str]]:
    """(line number, source) of each ```python block of the README."""
    text = README.read_text()
    return [(text.count("\n", 0, match.start()) + 1, match.group(1)) for match in FENCE.finditer(text)]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_readme_has_its_examples():
    assert len(readme_blocks()) >= MIN_BLOCKS


@pytest.mark.parametrize("line, source", readme_blocks(), ids=lambda v: f"line{v}" if isinstance(v, int) else "")
def test_a_readme_example_runs(line, source, tmp_path, monkeypatch):
    # A process group of one, as torchrun would describe it, for the example that starts one.
    for name, value in {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1",
                        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port())}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.chdir(tmp_path)
    code = compile(source, f"README.md, the example at line {line}", "exec")
    try:
        exec(code, {"__name__": "__readme__"})
    finally:
        import torch.distributed as dist

        # An example that failed midway must not leave its group to the next test.
        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()
