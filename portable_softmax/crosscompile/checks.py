"""What a compiled binary holds, read without a driver: NVIDIA resource use from ``cuobjdump``,
called functions' shared memory from the LLVM IR, and whether every wait loop of a split kernel
re-reads memory on each trip, from its final machine code (``machine_code``)."""
from __future__ import annotations

import os
import re
import subprocess
import tempfile
from typing import Any, Optional

from portable_softmax.crosscompile.targets import _nvidia_tool


def cubin_resources(cubin: bytes, kernel: str) -> dict[str, int]:
    """REG, STACK, SHARED, LOCAL, ... of ``kernel`` in a cubin, read with cuobjdump."""
    tool = _cuobjdump()
    if tool is None:
        raise RuntimeError("no cuobjdump found (Triton's nvidia backend bin/, PATH, /usr/local/cuda/bin)")
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, f"{kernel}.cubin")
        with open(path, "wb") as handle:
            handle.write(cubin)
        out = subprocess.run([tool, "--dump-resource-usage", path], capture_output=True, text=True, check=True).stdout
    found: dict[str, int] = {}
    in_kernel = False
    for line in out.splitlines():
        if line.strip().startswith("Function "):
            in_kernel = line.strip()[len("Function "):].rstrip(":") == kernel
        elif in_kernel:
            for key, value in re.findall(r"([A-Z]+(?:\[\d+\])?):(\d+)", line):
                found[key] = int(value)
    if "REG" not in found:
        raise RuntimeError(f"cuobjdump reported no resource usage for {kernel!r}:\n{out}")
    return found


def _cuobjdump() -> Optional[str]:
    return _nvidia_tool("cuobjdump")


def cubin_sass(cubin: bytes, inlined: bool = False) -> str:
    """The SASS of a cubin with labels and source lines (``nvdisasm -c -g``); with ``inlined``,
    each line's chain of inlined call sites too (``-gi``: the innermost first, a line each)."""
    tool = _nvidia_tool("nvdisasm")
    if tool is None:
        raise RuntimeError("no nvdisasm found (Triton's nvidia backend bin/, PATH, /usr/local/cuda/bin)")
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "kernel.cubin")
        with open(path, "wb") as handle:
            handle.write(cubin)
        flags = ["-c", "-gi" if inlined else "-g"]
        return subprocess.run([tool, *flags, path], capture_output=True, text=True, check=True).stdout


def called_shared_memory(llir: str, kernel: Optional[str] = None) -> list[str]:
    """The functions in a kernel's LLVM IR, other than the kernel, that address shared memory.
    Triton 3.6 gives a called function none of its own: what it uses overlaps the caller's,
    pipeline buffers in flight included (a pipelined split kernel gave NaN so, NOTES v9).

    The kernel is the function with a kernel calling convention, or the one named ``kernel``:
    Triton 3.2 marks an NVIDIA kernel only in ``!nvvm.annotations`` (``define void @name``)."""
    found: list[str] = []
    name = None
    for line in llir.splitlines():
        if line.startswith("define "):
            defined = line.split("@", 1)[1].split("(", 1)[0]
            is_kernel = "ptx_kernel" in line or "amdgpu_kernel" in line or defined.strip('"') == kernel
            name = None if is_kernel else defined
        elif name is not None and "global_smem" in line and name not in found:
            found.append(name)
    return found


def wait_loop_check(backend: str, compiled: Any) -> dict[str, Any]:
    """Whether every wait loop of a compiled split kernel reads memory on each trip, from its
    final machine code (``machine_code``): the count of wait loops found, and the reads in each."""
    from portable_softmax import machine_code

    if backend == "cuda":
        loops = machine_code.sass_loops(cubin_sass(compiled.asm["cubin"]))
    else:
        loops = machine_code.amdgcn_loops(compiled.asm["amdgcn"])
    waits = [loop for line in wait_source_lines() for loop in machine_code.wait_loops(loops, line)]
    return {"wait_loops": len(waits), "wait_loop_reads": [list(loop.reads[:2]) for loop in waits],
            "wait_loop_reads_memory": bool(waits) and all(loop.reads_memory for loop in waits)}


def wait_source_lines() -> tuple[str, ...]:
    """``exchange.py:N`` of each of the split kernels' wait loops (the ``while`` in
    ``kernels.exchange._awaited_slots`` and ``_awaited_count``), which the machine code's line
    information names."""
    import inspect

    from portable_softmax.kernels import exchange

    found = []
    for function in (exchange._awaited_slots.fn, exchange._awaited_count.fn):
        lines, first = inspect.getsourcelines(function)
        offset = next(i for i, line in enumerate(lines) if line.lstrip().startswith("while "))
        found.append(f"{os.path.basename(inspect.getsourcefile(function))}:{first + offset}")
    return tuple(found)
