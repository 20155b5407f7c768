"""Lower the Ascend kernels through triton-ascend to its Linalg stage, without CANN or an NPU.

Run it with the Python of a venv that has triton-ascend (``bash ci/ascend_lowering.sh`` makes one):
triton-ascend installs as the ``triton`` module, so it cannot share an environment with upstream
Triton. For every kernel the Ascend launch plans use (``*_tile`` and ``*_loop``: the planner never
picks ``split`` on Ascend, which cannot promise residency; the kernels of rows sharded across
ranks, ``distributed.py``; and the cross-entropy kernels, with the split forward's two launches),
for softmax and log-softmax, fp32, bf16 and fp16, and the block shapes the npu tuning table
yields, it builds the same ASTSource a launch
would and runs triton-ascend's own stages (``AscendBackend.add_stages`` for
``GPUTarget('npu', 'Ascend910B3', 0)``) in order, stopping before the first stage that needs CANN
(``npubin``: bishengir-compile turns the Linalg/HIVM module into an NPU binary).

Proven this way: the kernel source is accepted by triton-ascend's frontend (``ttir``), and its
``triton-adapter-opt`` lowers it to Linalg/HIVM (``ttadapter``). Not proven: that bishengir compiles
that module within the unified buffer, and that it runs correctly and fast: that takes a 910B.

    python ci/ascend_lowering.py [--out DIR] [--arch Ascend910B3]

Exits non-zero if any lowering fails; ``--out`` keeps every ``.ttir`` / ``.ttadapter.mlir``.
"""
import argparse
import hashlib
import importlib.util
import inspect
import itertools
import re
import subprocess
import sys
import time
import types
from pathlib import Path

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler.compiler import ASTSource, make_backend
from triton._C.libtriton import ir

ROOT = Path(__file__).resolve().parent.parent
KERNELS_DIR = ROOT / "portable_softmax" / "kernels"
VARIANTS_PY = ROOT / "portable_softmax" / "variants.py"
# The stage that needs CANN (bishengir-compile); everything before it is run.
CANN_STAGES = ("npubin",)
DTYPES = ("fp32", "bf16", "fp16")
# (BLOCK_M, BLOCK_N) the npu tuning table gives (tile_elements = row_elements = loop_chunk = 8192):
# tile: BLOCK_M = 8192 // BLOCK_N rows of one power-of-two width; backward tiles hold two inputs,
# so their rows stop at 4096; longer rows stream through the loop kernels in 8192-element chunks.
# (direction, regime): the block shapes the npu tuning table yields.
PLANS = {
    ("forward", "tile"): [(8, 1024), (4, 2048), (2, 4096), (1, 8192)],
    ("forward", "loop"): [(1, 8192)],
    ("backward", "tile"): [(8, 1024), (4, 2048), (2, 4096)],
    ("backward", "loop"): [(1, 8192)],
}


# The streamed kernels of rows cut into parts, every phase: rows sharded across ranks
# (``portable_softmax.distributed``; a long slice streamed in chunks, short ones in tiles of rows,
# the loop regime's shapes) and the sliced regime's tiles (128 bytes of adjacent bf16 and fp32
# rows: long reductions along a strided dimension, where Ascend's loop tiles would be few).
SHARDED_PLANS = [(1, 8192), (8, 1024), (64, 128), (32, 256)]


# The cross-entropy kernels (``kernels/loss.py``) in the block shapes the npu tuning table yields:
# tiles of whole rows (up to 8192 columns; 4096 where the gradient is formed from the same
# registers), rows streamed in 8192-element chunks, the backward in either block; each plain, with
# every option, and with probability targets.
LOSS_PLANS = {
    ("forward", "tile", False): [(8, 1024), (1, 8192)],
    ("forward", "tile", True): [(8, 1024), (2, 4096)],
    ("forward", "loop", False): [(1, 8192)],
    ("forward", "loop", True): [(1, 8192)],
    ("backward", "loop", False): [(8, 1024), (1, 8192)],
}
LOSS_FORMS = {"plain": {}, "every option": {"weight": True, "smoothing": True, "z_loss": True, "softcap": True},
              "probabilities": {"prob_target": True, "smoothing": True}}
# The loss's split kernel (``kernels/loss_split.py``; class targets only) as a backend without
# residency would run it, were its tuning to open the split path (``Tuning.split_two_launches``):
# rows of 16 chunks of 8192, the exchange in two launches (publish, then read), so no program
# waits on another; with and without the gradient, plain and with every option. Not the forward
# alone by arrival (PHASE 3): triton-ascend 3.2.0 fails to lower it (`triton-adapter-opt` exits 1),
# so Ascend's tuning row turns ``Tuning.loss_arrival`` off (``vendors.NPU_TUNING``).
LOSS_SPLIT_CHUNKS = 16
# The streamed forward alone's windows, as for 16-bit rows off 16-byte boundaries.
LOSS_WINDOW_ALIGN = 8


def lowering_jobs():
    """(kernel name, its key in the variant table, a label, the constexprs) of every lowering."""
    for (direction, regime), shapes in PLANS.items():
        # Tile grids loop over tiles, or (as many tiles as vector cores or fewer) give each a program.
        per_tile_forms = (False, True) if regime == "tile" else (None,)
        for (block_m, block_n), per_tile in itertools.product(shapes, per_tile_forms):
            for log in (False, True):
                # Ascend's tuning never rereads, and only twice-read tiles are dense.
                config = types.SimpleNamespace(regime=regime, block_m=block_m, block_n=block_n, chunks=1,
                                               chunks_p2=1, num_stages=1, align=1, ticketed=False, reread=False,
                                               per_tile=bool(per_tile), dense=False, flat=False)
                form = "" if per_tile is None else f" PER_TILE={int(per_tile)}"
                yield (variants.kernel_name(direction, regime), (direction, regime),
                       f"M={block_m} N={block_n} LOG={int(log)}{form}", variants.constexprs(config, variants.CallFacts(log)))
    # The fused variants (scale, masks, causal) of the kernels Ascend runs (tiles; the loop for
    # longer rows): a tensor scale with a bool mask and causal, a number scale with an additive mask.
    for (direction, regime), (block_m, block_n) in itertools.product(
            (("forward", "tile"), ("backward", "tile"), ("forward", "loop"), ("backward", "loop")), ((8, 1024),)):
        if regime == "loop":
            block_m, block_n = PLANS[(direction, regime)][0]
        for scale, mask, causal in ((2, 1, True), (1, 2, False)):
            config = types.SimpleNamespace(regime=regime, block_m=block_m, block_n=block_n, chunks=1, chunks_p2=1,
                                           num_stages=1, align=1, ticketed=False, reread=False, per_tile=False,
                                           dense=False, flat=False)
            facts = variants.CallFacts(False, scale=scale, mask=mask, causal=causal)
            yield (variants.kernel_name(direction, regime), (direction, regime),
                   f"M={block_m} N={block_n} SCALE={scale} MASK={mask} CAUSAL={int(causal)}",
                   variants.constexprs(config, facts))
    for phase in variants.SHARDED_PHASES:
        for block_m, block_n in SHARDED_PLANS:
            for log in (False,) if phase == "forward_partials" else (False, True):
                config = types.SimpleNamespace(regime="loop", block_m=block_m, block_n=block_n, chunks=1)
                yield (variants.sharded_kernel_name(phase), phase, f"M={block_m} N={block_n} LOG={int(log)}",
                       variants.sharded_constexprs(phase, config, log, False, 2))
    for (direction, regime, write_grad), shapes in LOSS_PLANS.items():
        for (block_m, block_n), (form, flags) in itertools.product(shapes, LOSS_FORMS.items()):
            # The forward alone and the backward of class targets stream rows off 16-byte
            # boundaries through aligned windows (``kernels/loss.py``: bf16 rows of 50257, ALIGN 8),
            # a row a tile.
            windowed = ((direction, regime, write_grad) in (("forward", "loop", False), ("backward", "loop", False))
                        and block_m == 1 and not flags.get("prob_target"))
            for align in (1, LOSS_WINDOW_ALIGN) if windowed else (1,):
                config = types.SimpleNamespace(regime=regime, block_m=block_m, block_n=block_n, align=align)
                facts = variants.LossFacts(write_grad=write_grad, **flags)
                yield (variants.loss_kernel_name(direction, regime), ("loss", direction, facts.prob_target, regime),
                       f"M={block_m} N={block_n} {form}" + (" WRITE_GRAD" if write_grad else "")
                       + (f" ALIGN={align}" if align > 1 else ""), variants.loss_constexprs(direction, config, facts))
    split = types.SimpleNamespace(regime="split", block_m=1, block_n=8192, chunks=LOSS_SPLIT_CHUNKS,
                                  chunks_p2=LOSS_SPLIT_CHUNKS, num_stages=1, align=1, ticketed=False, phased=True,
                                  arrival=False)
    # The default 'mean' with the gradient last: its grid counts its targets (``kernels/grid_count.py``)
    # and sums its loss (``kernels/grid_sum.py``: the loss the data's dtype), and a 'sum' summed alone.
    split_forms = [(write_grad, form, flags) for write_grad, (form, flags)
                   in itertools.product((False, True), list(LOSS_FORMS.items())[:2])]
    split_forms += [(True, "counted", {"counted": True}), (True, "counted summed", {"counted": True, "summed": True}),
                    (True, "summed", {"summed": True})]
    for write_grad, form, flags in split_forms:
        facts = variants.LossFacts(write_grad=write_grad, **flags)
        # With the gradient, its whole chunks through their own loop, as the loss planner forms it
        # (``Tuning.loss_whole_chunks``: 0 on Ascend, every row).
        config = types.SimpleNamespace(**vars(split), whole_loop=write_grad)
        summed = ("summed",) if variants.loss_sums(config, facts) else ()
        for phase in variants.launch_phases(config):
            label = f"M=1 N=8192 CHUNKS={LOSS_SPLIT_CHUNKS} PHASE={phase} {form}"
            yield (variants.loss_kernel_name("forward", "split"), ("loss", "forward", False, "split", *summed),
                   label + (" WRITE_GRAD" if write_grad else ""),
                   variants.loss_constexprs("forward", config, facts, phase))
    yield (variants.GRAD_SCALE_KERNEL, "grad_scale", f"BLOCK={variants.GRAD_SCALE_BLOCK}",
           {"BLOCK": variants.GRAD_SCALE_BLOCK, "ACC_FP64": False, "DEPENDENT": False})
    for weight in (False, True):
        yield (variants.STATS_KERNEL, "stats", f"BLOCK={variants.STATS_BLOCK} WEIGHT={int(weight)}",
               {"BLOCK": variants.STATS_BLOCK, "WEIGHT": weight, "ACC_FP64": False, "DEPENDENT": False})
    # The sum's blocks the npu tuning table yields (``loss_planner.plan_sum``: four rows of 8192,
    # a quarter of that with the counted targets beside).
    for counted, block in ((False, 32768), (True, 8192)):
        yield (variants.SUM_KERNEL, "sum", f"BLOCK={block} COUNTED={int(counted)}",
               {"BLOCK": block, "ACC_FP64": False, "COUNTED": counted, "DEPENDENT": False})


def load_module(name, path, package=False):
    """One file (or with ``package``, one folder's package) of the package alone: the package's
    __init__ imports torch, which this venv need not have. The kernels package and variants.py
    (the table of kernel variants) import neither."""
    if package:
        spec = importlib.util.spec_from_file_location(name, path / "__init__.py",
                                                      submodule_search_locations=[str(path)])
    else:
        spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


variants = load_module("portable_softmax_variants", VARIANTS_PY)


def kernel_parameters(kernel):
    """The variant table's tensors (name -> element type, None for the data's) and parameter
    names of ``kernel``: (direction, regime), a phase of sharded rows (partials in fp32), a
    cross-entropy kernel ("loss", direction, probability targets, regime), the gradient's rescale,
    the stats of a 'mean' or a reduced loss's sum."""
    if kernel == "grad_scale":
        return {"grad_ptr": None, "dloss_ptr": None}, variants.GRAD_SCALE_PARAMETERS
    if kernel == "sum":
        # The loss's terms fp32, class targets int64, the loss the data's dtype.
        return {"terms_ptr": "fp32", "target_ptr": "i64", "out_ptr": None}, variants.SUM_PARAMETERS
    if kernel == "stats":
        # Class targets int64; weights, the kept values and the stats fp32.
        return ({"target_ptr": "i64", "weight_ptr": "fp32", "kept_ptr": "fp32", "stats_ptr": "fp32"},
                variants.STATS_PARAMETERS)
    if isinstance(kernel, str):
        tensors = {f"{t}_ptr": ("fp32" if t == "stats" else None) for t in variants.SHARDED_TENSORS[kernel]}
        return tensors, variants.sharded_parameter_names(kernel)
    if kernel[0] == "loss":
        # Class targets int64 (probabilities: the data's dtype); weights, stats, loss rows, lse fp32
        # (a split grid that sums the loss: the loss the data's dtype); a split kernel's scratch as
        # ``variants.SCRATCH`` types it.
        _, direction, probabilities, regime, *summed = kernel
        types = {"target": None if probabilities else "i64", "weight": "fp32", "stats": "fp32",
                 "loss": None if summed else "fp32",
                 "lse": "fp32", **{f"{name}": kind for name, kind in variants.SCRATCH}}
        names = variants.loss_parameter_names(direction, regime)
        return ({name: types.get(name[:-len("_ptr")]) for name in names if name.endswith("_ptr")}, names)
    direction, regime = kernel
    return ({f"{t}_ptr": None for t in variants.tensor_names(direction, regime)},
            variants.parameter_names(direction, regime))


def source_for(fn, kernel, dtype, constexprs):
    """The ASTSource a launch builds (Triton 3.2 API), from the variant table's parameter list:
    tensors as pointers to ``dtype``, 16-byte aligned as torch allocates them; the counts and
    strides as i32 (the sizes lowered here); the constexprs as "constexpr"."""
    tensors, names = kernel_parameters(kernel)
    declared = [p.name for p in fn.params if not p.is_constexpr]
    if list(names) != declared:
        raise RuntimeError(f"{fn.__name__}: the kernels declare {declared}, the variant table {list(names)}")
    signature, hints = {}, {}
    for i, param in enumerate(fn.params):
        if param.is_constexpr:
            signature[param.name] = "constexpr"
        elif param.name in tensors:
            signature[param.name] = "*" + (tensors[param.name] or dtype)
        elif param.name in variants.FLOAT_SCALARS:
            signature[param.name] = "fp32"
            hints[i] = 16
        else:
            signature[param.name] = "i32"
    # A constexpr the variant leaves out takes its default, as ``kernel[grid](...)`` binds it (the
    # tiles' windows: ``variants.constexprs``).
    defaults = inspect.signature(fn.fn).parameters
    constants = {name: constexprs[name] if name in constexprs else defaults[name].default
                 for name, ty in signature.items() if ty == "constexpr"}
    from triton.backends.compiler import AttrsDescriptor

    return ASTSource(fn, signature, constants=constants, attrs=AttrsDescriptor.from_hints(hints))


def _stage(compile_ir, module, metadata, ext):
    """One stage; a tool killed by a signal is run once more, and said so. triton-adapter-opt once
    aborted (SIGABRT) on a kernel that lowered in every run before and after, in CI and here; a
    lowering that fails twice is a failure."""
    try:
        return compile_ir(module, metadata)
    except subprocess.CalledProcessError as e:
        if e.returncode >= 0:
            raise
        print(f"stage {ext}: {Path(e.cmd[0]).name} killed by signal {-e.returncode}; running it once more",
              file=sys.stderr)
        return compile_ir(module, metadata)


def lower(backend, fn, kernel, dtype, constexprs, options, out_dir):
    """Run the backend's stages up to (not including) the first CANN stage, as triton.compile does."""
    src = source_for(fn, kernel, dtype, constexprs)
    opts = backend.parse_options(dict(options))
    stages = {}
    backend.add_stages(stages, opts)
    metadata = {"hash": src.hash(), "target": backend.target, **opts.__dict__}
    context = ir.context()
    ir.load_dialects(context)
    backend.load_dialects(context)
    module = src.make_ir(opts, backend.get_codegen_implementation(), backend.get_module_map(), context)
    reached, sizes = [], {}
    for ext, compile_ir in stages.items():
        if ext in CANN_STAGES:
            break
        try:
            module = _stage(compile_ir, module, metadata, ext)
        except subprocess.CalledProcessError as e:  # triton-adapter-opt: report its stderr
            err = (e.stderr or b"").decode(errors="replace").strip()
            raise RuntimeError(f"stage {ext}: {Path(e.cmd[0]).name} exited {e.returncode}: {err[-2000:]}") from None
        except Exception as e:
            raise RuntimeError(f"stage {ext}: {type(e).__name__}: {e}") from None
        text = str(module)
        reached.append(ext)
        sizes[ext] = len(text.encode())
        if out_dir:
            # The constexprs that differ from False, with a digest of all of them: every name unique,
            # short enough for the file system (the split loss kernel has 19).
            shape = "_".join(f"{k}{v}" for k, v in constexprs.items() if v is not False)
            digest = hashlib.sha1(repr(sorted(constexprs.items())).encode()).hexdigest()[:8]
            name = f"{fn.__name__}.{dtype}.{shape}.{digest}.{ext}" + (".mlir" if ext == "ttadapter" else "")
            (out_dir / name).write_text(text)
    return reached, sizes, module, list(stages)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", default="Ascend910B3")
    parser.add_argument("--out", type=Path, help="keep every stage's IR here")
    args = parser.parse_args(argv)
    out_dir = args.out
    if out_dir:
        out_dir.mkdir(parents=True, exist_ok=True)

    kernels = load_module("portable_softmax_kernels", KERNELS_DIR, package=True)
    target = GPUTarget("npu", args.arch, 0)
    backend = make_backend(target)
    # max_warps = 1 on npu (tuning table); num_warps does not reach the Linalg stage anyway.
    options = {"num_warps": 1, "num_stages": 1}
    print(f"triton {triton.__version__} ({Path(triton.__file__).parent}), backend {type(backend).__name__}, "
          f"target {target}")

    rows, failures = [], 0
    started = time.perf_counter()
    all_stages = None
    for name, kernel, label, constexprs in lowering_jobs():
        fn = getattr(kernels, name)
        for dtype in DTYPES:
            t0 = time.perf_counter()
            try:
                reached, sizes, linalg, all_stages = lower(backend, fn, kernel, dtype, constexprs, options, out_dir)
                ok = "ttadapter" in reached
                status = "ok" if ok else f"FAIL: stopped after {reached}"
                mix = ""
                if ok:  # aiv: vector cores only (no cube/matmul part), as a softmax should be
                    found = re.search(r'mix_mode\s*=\s*"([^"]+)"', linalg)
                    mix = found.group(1) if found else "?"
            except Exception as e:  # noqa: BLE001 - every failure is reported, then counted
                ok, reached, sizes, mix, status = False, [], {}, "", f"FAIL: {e}"
            failures += not ok
            rows.append((name, dtype, label, "->".join(reached) or "-", sizes.get("ttadapter", 0), mix,
                         round((time.perf_counter() - t0) * 1000), status))

    header = ("kernel", "dtype", "constexprs", "stages", "linalg_bytes", "mode", "ms", "status")
    widths = [max(len(str(r[i])) for r in rows + [header]) for i in range(len(header) - 1)]
    fmt = "  ".join(f"{{:{w}}}" for w in widths) + "  {}"
    print(fmt.format(*header))
    for row in rows:
        print(fmt.format(*row))
    skipped = [s for s in (all_stages or []) if s in CANN_STAGES]
    print(f"\n{len(rows) - failures}/{len(rows)} lowered to ttadapter (Linalg) in "
          f"{time.perf_counter() - started:.1f}s; not run (needs CANN): {', '.join(skipped) or CANN_STAGES[0]}")
    if failures:
        print(f"{failures} lowering(s) FAILED", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
