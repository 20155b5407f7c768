"""The targets a compile report covers (``cuda:<compute capability>``, ``hip:<gfx arch>``), the
device record that stands for each (a recorded chip's, or a synthetic one), and whether this
machine's Triton and toolchain can compile for it."""
from __future__ import annotations

import functools
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from typing import Any, Optional

from portable_softmax.backend import get_backend
from portable_softmax.profiles import load_profile, profile_names, recorded_properties
from portable_softmax.record import DeviceRecord

DEFAULT_TARGETS = ("cuda:80", "cuda:90", "cuda:100", "hip:gfx90a", "hip:gfx942", "hip:gfx950", "hip:gfx1100")

# The recorded chip that stands for each target. Targets not listed get a synthetic record.
TARGET_PROFILES = {
    "cuda:80": "a100",
    "cuda:90": "h100",
    "hip:gfx90a": "mi250x",
    "hip:gfx942": "mi300x",
    "hip:gfx1100": "rx7900xtx",
}

_TARGET_FORMS = "cuda:<compute capability> (e.g. cuda:90) or hip:<gfx arch> (e.g. hip:gfx942)"

# Triton's backend (``triton.backends.backends``) that compiles for each target kind.
TRITON_BACKENDS = {"cuda": "nvidia", "hip": "amd"}


@dataclass(frozen=True)
class Target:
    """A Triton compilation target: ``GPUTarget(backend, arch, warp_size)``."""

    backend: str
    arch: Any  # int compute capability for cuda, "gfx..." for hip
    warp_size: int
    profile: Optional[str] = None  # a recorded chip named explicitly (``cuda:90=h200``)

    @property
    def name(self) -> str:
        return f"{self.backend}:{self.arch}"


def parse_target(text: str) -> Target:
    """``cuda:90`` / ``hip:gfx942`` (optionally ``=profile`` to pick the recorded chip) -> Target.

    Raises:
        ValueError: the string is not such a target, naming the accepted forms.
    """
    spec, _, profile = text.strip().partition("=")
    backend, sep, arch = spec.strip().partition(":")
    backend, arch = backend.strip().lower(), arch.strip().lower()
    known = ", ".join(TARGET_PROFILES)
    if not sep or backend not in ("cuda", "hip"):
        raise ValueError(f"unknown target {text!r}: expected {_TARGET_FORMS}; recorded targets: {known}")
    if backend == "cuda":
        if not arch.isdigit() or not 30 <= int(arch) <= 999:
            raise ValueError(f"unknown target {text!r}: a cuda target names a compute capability as "
                             f"major*10+minor, e.g. cuda:80, cuda:90, cuda:100")
        target = Target("cuda", int(arch), 32)
    else:
        if not re.fullmatch(r"gfx[0-9]{1,2}[0-9a-f]{2}", arch):
            raise ValueError(f"unknown target {text!r}: a hip target names a gfx architecture without "
                             f"feature flags, e.g. hip:gfx90a, hip:gfx942, hip:gfx1100")
        # CDNA (gfx9) runs wave64; RDNA (gfx10+) wave32, as Triton compiles for it.
        target = Target("hip", arch, 32 if _gfx_family(arch) >= 10 else 64)
    if profile:
        profile = profile.strip()
        if profile not in profile_names():
            raise ValueError(f"target {text!r}: unknown device profile {profile!r}; recorded profiles: "
                             f"{', '.join(profile_names())}")
        if load_profile(profile)["target"]["backend"] != target.backend:
            raise ValueError(f"target {text!r}: profile {profile!r} is not a {target.backend} chip")
        target = Target(target.backend, target.arch, target.warp_size, profile)
    return target


def _gfx_family(gfx: str) -> int:
    """gfx942 -> 9, gfx1100 -> 11 (the major version, as Triton's HIP options read it)."""
    return int(gfx[3:-2])


def _gfx_key(gfx: str) -> tuple[int, int]:
    return _gfx_family(gfx), int(gfx[-2:], 16)


def target_record(target: Target) -> tuple[DeviceRecord, str, Optional[str]]:
    """The device record for ``target``, the profile it comes from, and a note if it is synthetic."""
    name = target.profile or TARGET_PROFILES.get(target.name) or _nearest_profile(target)
    profile = load_profile(name)
    properties = recorded_properties(profile)
    # Named as the live device is, where the profile says: tuning rows may be keyed by that name
    # (the H200's), as ``profiles.profile_record`` names it.
    description = profile.get("device_name", profile["description"])
    recorded = profile["target"]
    note = None
    if str(recorded["arch"]) != str(target.arch):
        note = (f"synthetic record: no recorded {target.name} chip; {name}'s recorded properties "
                f"({recorded['backend']}:{recorded['arch']}) with the architecture replaced by {target.arch}")
        description = f"synthetic {target.name}, from {name} ({profile['description']})"
        if target.backend == "hip":
            properties["arch"] = target.arch
        properties["warpSize"] = target.warp_size
    record = get_backend(target.backend).normalize(properties, target.arch, description)
    return record, name, note


def _nearest_profile(target: Target) -> str:
    candidates = [(parse_target(name), profile) for name, profile in TARGET_PROFILES.items()]
    candidates = [(t, p) for t, p in candidates if t.backend == target.backend]
    if target.backend == "cuda":
        def distance(t: Target) -> tuple:
            return abs(t.arch - target.arch), -t.arch
    else:
        def distance(t: Target) -> tuple:
            (family, minor), (own_family, own_minor) = _gfx_key(t.arch), _gfx_key(target.arch)
            return abs(family - own_family), abs(minor - own_minor)
    return min(candidates, key=lambda c: distance(c[0]))[1]


def toolchain_missing(target: Target) -> Optional[str]:
    """Why ``target`` cannot be compiled and read here, or None: what this Triton needs for it
    (``compat.missing_toolchain``), and for NVIDIA targets the cuobjdump that reads the resources."""
    from portable_softmax import compat

    missing = compat.missing_toolchain(target.backend)
    if missing is None and target.backend == "cuda":
        absent = [tool for tool in ("cuobjdump", "nvdisasm") if _nvidia_tool(tool) is None]
        if absent:
            missing = (f"no {' or '.join(absent)} found (Triton's nvidia backend bin/, PATH, /usr/local/cuda/bin) "
                       f"to read the cubins")
    return missing


def _nvidia_tool(name: str) -> Optional[str]:
    """``cuobjdump`` or ``nvdisasm``: Triton's bundled copy, else one on PATH or in CUDA's folder."""
    try:
        from triton import knobs

        path = getattr(knobs.nvidia, name).path
        if path and os.path.exists(path):
            return path
    except Exception:  # older Triton: no knobs, or no bundled tool
        pass
    import shutil

    import triton

    bundled = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", name)
    for candidate in (bundled, shutil.which(name), f"/usr/local/cuda/bin/{name}"):
        if candidate and os.path.exists(candidate):
            return candidate
    return None


def target_problem(target: Target) -> Optional[str]:
    """Why this Triton cannot compile for ``target`` (a sentence), or None if it can."""
    import triton
    import triton.backends

    backend = TRITON_BACKENDS[target.backend]
    if backend not in triton.backends.backends:
        return (f"this Triton ({triton.__version__}) has no {backend!r} backend (installed: "
                f"{', '.join(sorted(triton.backends.backends)) or 'none'})")
    if target.backend == "cuda":
        capabilities = _cuda_capabilities()
        if capabilities is not None:
            if target.arch in capabilities:
                return None
            return (f"Triton {triton.__version__} compiles for compute capabilities "
                    f"{', '.join(map(str, capabilities))} (cuda:{capabilities[0]} to cuda:{capabilities[-1]})")
    reason = _probe(target.backend, str(target.arch), target.warp_size)
    return None if reason is None else f"Triton {triton.__version__} cannot compile for it ({reason})"


@functools.lru_cache(maxsize=None)
def _cuda_capabilities() -> Optional[tuple]:
    """Compute capabilities Triton's NVIDIA backend compiles for: its ``sm_arch_from_capability``
    name of each must be one the ptxas it picks for that capability takes. None if unknown."""
    try:
        from triton.backends.nvidia.compiler import get_ptxas, sm_arch_from_capability

        def known(capability: int) -> bool:
            return sm_arch_from_capability(capability) in _ptxas_architectures(get_ptxas(capability).path)

        names = _ptxas_architectures(get_ptxas(80).path) | _ptxas_architectures(get_ptxas(90).path)
        return tuple(sorted(c for c in {int(re.sub(r"[a-z]$", "", n)[3:]) for n in names} if known(c))) or None
    except Exception:  # noqa: BLE001  (no ptxas, another Triton layout: the compile itself will say)
        return None


@functools.lru_cache(maxsize=None)
def _ptxas_architectures(path: str) -> frozenset:
    """The ``sm_*`` names a ptxas takes (its ``--help`` lists them); empty if it cannot be run."""
    try:
        text = subprocess.run([path, "--help"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return frozenset()
    return frozenset(re.findall(r"'(sm_[0-9]+[a-z]?)'", text))


@functools.lru_cache(maxsize=None)
def _probe(backend: str, arch: str, warp_size: int) -> Optional[str]:
    """Why Triton cannot compile a trivial kernel for the target, or None if it can (or the probe
    could not finish: the compile itself will say)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    package_root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [package_root, env.get("PYTHONPATH")]))
    with tempfile.TemporaryDirectory() as folder:
        script = os.path.join(folder, "probe.py")  # triton.jit reads its function's source file
        with open(script, "w") as handle:
            handle.write(_PROBE)
        try:
            done = subprocess.run([sys.executable, script, backend, arch, str(warp_size)], capture_output=True,
                                  text=True, env=env, timeout=_PROBE_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            return None
    if done.returncode == 0:
        return None
    # MLIR's "<file>:<line>:<col>: error: unsupported target: 'gfx999'", else the last error line.
    errors = re.findall(r"error:\s*(.+)", done.stderr, flags=re.IGNORECASE)
    reasons = [e for e in errors if "unsupported target" in e] or errors[-1:] or [f"exit code {done.returncode}"]
    return reasons[0].strip()[:300]


# A kernel as small as kernels come, compiled in a worker process to learn whether Triton's AMD
# backend takes a gfx architecture: the list lives in its C++ ("unsupported target: 'gfx999'").
_PROBE = """
import sys
import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from portable_softmax import compat


@triton.jit
def probe(x_ptr):
    tl.store(x_ptr, tl.load(x_ptr) + 1.0)


backend, arch, warp_size = sys.argv[1], sys.argv[2], int(sys.argv[3])
target = GPUTarget(backend, int(arch) if backend == "cuda" else arch, warp_size)
triton.compile(compat.ast_source(probe, {"x_ptr": "*fp32"}, {}), target=target)
"""

_PROBE_TIMEOUT_S = 300
