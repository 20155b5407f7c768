"""The compile itself: ``triton.compile`` of one variant for its target and what its binary uses,
each in a worker process (spawned, without ``TRITON_INTERPRET``) under a per-compile timeout, so
that a compile that never ends is reported as a timeout instead of hanging the run."""
from __future__ import annotations

import os
import signal
import sys
import tempfile
import time
import traceback
from collections import deque
from typing import Any, Callable, Optional, Sequence

from portable_softmax.amdgcn import amdgcn_resources, kernel_resources
from portable_softmax.crosscompile.checks import called_shared_memory, cubin_resources, wait_loop_check

DEFAULT_TIMEOUT_S = 600.0


def compile_all(specs: Sequence[dict[str, Any]], *, jobs: int = 2, timeout: float = DEFAULT_TIMEOUT_S,
                progress: Optional[Callable[[int, dict[str, Any]], None]] = None) -> list[dict[str, Any]]:
    """Compile ``specs`` in ``jobs`` spawned workers; each result is ``{"status": "ok"|"error"|
    "timeout", ...}``. A compile running past ``timeout`` seconds has its worker killed."""
    import multiprocessing
    from multiprocessing.connection import wait

    context = multiprocessing.get_context("spawn")
    results: list[Optional[dict[str, Any]]] = [None] * len(specs)
    pending = deque(range(len(specs)))
    workers: list[_Worker] = []
    startup_limit = max(timeout, 120.0)

    def finish(index: int, result: dict[str, Any]) -> None:
        results[index] = result
        if progress is not None:
            progress(index, result)

    try:
        while pending or any(w.task is not None for w in workers):
            while len(workers) < min(jobs, len(pending) + sum(w.task is not None for w in workers)):
                worker = _Worker(context)
                worker.deadline = time.monotonic() + startup_limit
                workers.append(worker)
            for worker in workers:
                if worker.ready and worker.task is None and pending:
                    worker.task = pending.popleft()
                    worker.deadline = time.monotonic() + timeout
                    worker.conn.send((worker.task, specs[worker.task]))
            nearest = min(w.deadline for w in workers) - time.monotonic()
            ready = wait([w.conn for w in workers], timeout=None if nearest == float("inf") else max(0.0, nearest))
            for worker in list(workers):
                if worker.conn in ready:
                    try:
                        kind, index, payload = worker.conn.recv()
                    except (EOFError, OSError):
                        code = worker.process.exitcode
                        worker.process.join(5)
                        died = f"compiler process died (exit code {worker.process.exitcode or code})"
                        if worker.task is not None:
                            finish(worker.task, {"status": "error", "error": died})
                        elif not worker.ready and pending:  # died starting: charge a task, so the run ends
                            finish(pending.popleft(), {"status": "error", "error": f"{died} while starting"})
                        workers.remove(worker)
                        worker.conn.close()
                        continue
                    if kind == "ready":
                        worker.ready = True
                        worker.deadline = float("inf")
                    elif kind == "broken":
                        workers.remove(worker)
                        worker.stop()
                        while pending:
                            finish(pending.popleft(), {"status": "error",
                                                       "error": f"compiler process could not start:\n{payload}"})
                    else:
                        status = "ok" if kind == "done" else "error"
                        finish(index, {"status": status, **payload} if status == "ok" else
                               {"status": status, "error": payload})
                        worker.task = None
                        worker.deadline = float("inf")
                elif time.monotonic() >= worker.deadline:
                    if worker.task is not None:
                        finish(worker.task, {"status": "timeout", "error": f"compile ran past {timeout:g} s"})
                    elif pending:  # never became ready
                        finish(pending.popleft(), {"status": "error",
                                                   "error": f"compiler process did not start in {startup_limit:g} s"})
                    workers.remove(worker)
                    worker.kill()
    finally:
        for worker in workers:
            if worker.task is None:
                worker.stop()
            else:
                worker.kill()
    return [r if r is not None else {"status": "error", "error": "not compiled"} for r in results]


class _Worker:
    def __init__(self, context: Any) -> None:
        parent, child = context.Pipe()
        self.process = context.Process(target=_worker_main, args=(child,), daemon=True)
        saved = os.environ.pop("TRITON_INTERPRET", None)  # read when a kernel is decorated
        try:
            self.process.start()
        finally:
            if saved is not None:
                os.environ["TRITON_INTERPRET"] = saved
        child.close()
        self.conn = parent
        self.ready = False
        self.task: Optional[int] = None
        self.deadline = time.monotonic()

    def kill(self) -> None:
        pid = self.process.pid
        try:
            os.killpg(pid, signal.SIGKILL)  # the worker's own group (it called setsid)
        except (AttributeError, OSError):
            self.process.kill()
        self.process.join(5)
        self.conn.close()

    def stop(self) -> None:
        try:
            self.conn.send(None)
        except OSError:
            pass
        self.process.join(10)
        if self.process.is_alive():
            self.kill()
        else:
            self.conn.close()


def _worker_main(conn: Any) -> None:
    if hasattr(os, "setsid"):
        os.setsid()  # its own process group, so a timeout also ends ptxas / ld.lld children
    import warnings

    warnings.filterwarnings("ignore", message=".*TRITON_DEFAULT_FP_FUSION.*")
    try:
        import triton  # noqa: F401

        from portable_softmax import kernels  # noqa: F401
    except BaseException:
        conn.send(("broken", None, traceback.format_exc(limit=3)))
        return
    conn.send(("ready", None, None))
    while True:
        try:
            message = conn.recv()
        except EOFError:
            return
        if message is None:
            return
        index, spec = message
        # MLIR and LLVM print diagnostics (whole IR dumps) straight to fd 2: keep them out of the
        # report, and quote their error lines when the compile fails.
        with tempfile.TemporaryFile(mode="w+b") as log:
            saved = os.dup(2)
            os.dup2(log.fileno(), 2)
            try:
                result: Any = ("done", index, compile_variant(spec))
            except BaseException as error:  # a compile error is a result, not a worker failure
                result = ("error", index, error)
            finally:
                sys.stderr.flush()
                os.dup2(saved, 2)
                os.close(saved)
            if result[0] == "error":
                log.seek(0)
                diagnostics = [line.strip() for line in log.read().decode(errors="replace").splitlines()
                               if " error: " in line or line.startswith("error: ")]
                text = str(result[2]).strip()
                text = text if len(text) < 2000 else text[:600] + "\n...\n" + text[-1200:]
                result = ("error", index, "\n".join([f"{type(result[2]).__name__}: {text}", *diagnostics[:4]]))
        conn.send(result)


def compile_variant(spec: dict[str, Any]) -> dict[str, Any]:
    """Compile one variant for its target and read its resource use. Runs in a worker process."""
    started = time.perf_counter()
    backend = spec["target"][0]
    compiled, signature, divisible, equal_to_1 = compiled_variant(spec)
    compile_s = time.perf_counter() - started
    name = compiled.metadata.name
    result: dict[str, Any] = {"compile_s": round(compile_s, 2), "shared": int(compiled.metadata.shared),
                              "signature": {k: v for k, v in signature.items() if v != "constexpr"},
                              "specialised": {"divisible_by_16": divisible, "equal_to_1": equal_to_1},
                              "called_shared": called_shared_memory(compiled.asm.get("llir", ""), name)}
    if spec["kernel"].endswith("_split"):
        result.update(wait_loop_check(backend, compiled))
    if backend == "cuda":
        usage = cubin_resources(compiled.asm["cubin"], name)
        # As the driver reports them: n_regs, and n_spills = local bytes / 4, which count the
        # stack frame, where ptxas spills (an H200 read 24, 52, 70 spills for STACK 96, 208, 280
        # bytes and LOCAL 0: benchmarks/probes/spill_count.py, NOTES v21).
        local = usage.get("LOCAL", 0) + usage.get("STACK", 0)
        result.update(registers=usage["REG"], spills=local // 4, static_shared=usage.get("SHARED", 0),
                      detail={k.lower(): v for k, v in usage.items() if k in ("REG", "STACK", "SHARED", "LOCAL")})
    else:
        usage = amdgcn_resources(compiled.asm["amdgcn"])
        # As a live launch reads them (launch._compiled_resources): one rule for both.
        used = kernel_resources(usage, spec["options"]["num_warps"], result["shared"])
        result.update(registers=used.registers, spills=used.spills, sgprs=used.sgprs,
                      static_shared=usage.get("group_segment_fixed_size", 0), detail=usage)
    return result


def compiled_variant(spec: dict[str, Any]) -> tuple[Any, dict[str, str], list[str], list[str]]:
    """``triton.compile`` of one variant for its target: the compiled kernel, its signature, and
    the arguments specialised as divisible by 16 and as equal to 1."""
    import triton
    from triton.backends.compiler import GPUTarget

    from portable_softmax import compat, kernels

    backend, arch, warp_size = spec["target"]
    fn = getattr(kernels, spec["kernel"])
    args = iter(spec["args"])
    signature: dict[str, str] = {}
    constexprs: dict[str, Any] = {}
    divisible: list[str] = []
    equal_to_1: list[str] = []
    for param in fn.params:
        if param.is_constexpr:
            # One the variant leaves out takes its default (``compat.ast_source``).
            if param.name in spec["constexprs"]:
                signature[param.name] = "constexpr"
                constexprs[param.name] = spec["constexprs"][param.name]
            continue
        kind, flag = next(args)
        signature[param.name] = kind
        if kind == "constexpr":  # an integer equal to 1, specialised away like a constexpr
            constexprs[param.name] = flag
            equal_to_1.append(param.name)
        elif flag:
            divisible.append(param.name)
    source = compat.ast_source(fn, signature, constexprs, divisible)
    compiled = triton.compile(source, target=GPUTarget(backend, arch, warp_size), options=dict(spec["options"]))
    return compiled, signature, divisible, equal_to_1
