"""Consistency checks for the CI matrix (ci/matrix.json), the per-backend
environment folders (backends/<name>/) and the workflow that consumes them
(.github/workflows/ci.yml).

Needs neither torch nor a device: it only reads files (and, when the
check_jsonschema module is importable, runs check-jsonschema on the workflow).
Every check collects all problems and fails with the full list.
"""

import importlib.util
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
MATRIX_PATH = REPO_ROOT / "ci" / "matrix.json"
EXPAND_PATH = REPO_ROOT / "ci" / "expand_matrix.jq"
PYPROJECT_PATH = REPO_ROOT / "pyproject.toml"
BACKENDS_DIR = REPO_ROOT / "backends"
WORKFLOW_PATH = REPO_ROOT / ".github" / "workflows" / "ci.yml"

ENV_FILES = ("requirements.txt", "Containerfile", "backend.json")
DEVICES = {"cpu", "cuda", "npu"}
# PORTABLE_SOFTMAX_REQUIRE_DEVICE names used by tests/conftest.py, per Triton backend
REQUIRE_DEVICE = {"interpreter": "cpu", "cuda": "cuda", "hip": "hip", "npu": "npu"}
# device -> Triton backends that may drive it
TRITON_BACKENDS = {"cpu": {"interpreter"}, "cuda": {"cuda", "hip"}, "npu": {"npu"}}
# what each Triton backend's device_check must really test
DEVICE_CHECK_NEEDS = {
    "interpreter": ("import torch",),
    "cuda": ("torch.cuda.is_available()", "torch.version.cuda"),
    "hip": ("torch.cuda.is_available()", "torch.version.hip"),
    "npu": ("torch_npu", "torch.npu.is_available()"),
}
REQUIRED_ENTRY_FIELDS = {
    "backend": str,
    "runs_on": list,
    "container": (dict, type(None)),
    "python": (str, type(None)),
    "pip_extra_index_url": (str, type(None)),
    "env_dir": str,
    "device": str,
    "require_device": str,
    "vendor_torch": bool,
    "validate": bool,
    "ascend_lowering": bool,
    "cross_compile_targets": list,
    "triton_versions": list,
}
VERSION_RE = re.compile(r"^[0-9]+\.[0-9]+\.[0-9]+$")
TARGET_RE = re.compile(r"^(cuda:[0-9]+|hip:gfx[0-9A-Za-z]+)$")
GITHUB_HOSTED_PREFIXES = ("ubuntu-", "windows-", "macos-")


def load_matrix():
    assert MATRIX_PATH.is_file(), f"{MATRIX_PATH} is missing"
    data = json.loads(MATRIX_PATH.read_text())
    assert isinstance(data, list) and data, "ci/matrix.json must be a non-empty JSON list"
    assert all(isinstance(e, dict) for e in data), "every matrix entry must be an object"
    return data


def name_of(entry):
    return entry.get("backend", "<no backend>")


def expand_matrix(entries):
    """The jobs ci/expand_matrix.jq makes of the entries: one per Triton version an entry lists
    (``triton``: that version), else one (``triton``: None); on an axis only the newest version's
    job keeps ``ascend_lowering``."""
    jobs = []
    for entry in entries:
        versions = entry.get("triton_versions") or []
        for version in versions or [None]:
            job = {**entry, "triton": version}
            if versions:
                job["ascend_lowering"] = bool(entry.get("ascend_lowering")) and version == versions[-1]
            jobs.append(job)
    return jobs


def release(version):
    return tuple(int(part) for part in version.split("."))


def fail_if(errors):
    if errors:
        pytest.fail("\n".join(errors))


def test_entries_have_required_fields_with_types():
    errors = []
    for entry in load_matrix():
        for field, types in REQUIRED_ENTRY_FIELDS.items():
            if field not in entry:
                errors.append(f"{name_of(entry)}: missing field {field!r}")
            elif not isinstance(entry[field], types):
                errors.append(f"{name_of(entry)}: {field!r} has type {type(entry[field]).__name__}")
        unknown = set(entry) - set(REQUIRED_ENTRY_FIELDS)
        if unknown:
            errors.append(f"{name_of(entry)}: undocumented fields {sorted(unknown)} (document them in ci/README.md)")
    fail_if(errors)


def test_backend_names_unique():
    names = [name_of(e) for e in load_matrix()]
    dupes = sorted({n for n in names if names.count(n) > 1})
    assert not dupes, f"duplicate backend names in ci/matrix.json: {dupes}"


def test_env_dirs_exist_and_are_complete():
    errors = []
    for entry in load_matrix():
        env_dir = REPO_ROOT / entry.get("env_dir", "")
        if entry.get("env_dir") != f"backends/{name_of(entry)}":
            errors.append(f"{name_of(entry)}: env_dir should be backends/{name_of(entry)}, got {entry.get('env_dir')!r}")
        if not env_dir.is_dir():
            errors.append(f"{name_of(entry)}: env_dir {entry.get('env_dir')!r} does not exist")
            continue
        for fname in ENV_FILES:
            if not (env_dir / fname).is_file():
                errors.append(f"{name_of(entry)}: {entry['env_dir']}/{fname} is missing")
    fail_if(errors)


def test_every_backend_folder_is_in_matrix_exactly_once():
    assert BACKENDS_DIR.is_dir(), "backends/ is missing"
    folders = sorted(p.name for p in BACKENDS_DIR.iterdir() if p.is_dir() and not p.name.startswith((".", "_")))
    assert folders, "backends/ has no backend folders"
    env_dirs = [e.get("env_dir") for e in load_matrix()]
    errors = []
    for folder in folders:
        count = env_dirs.count(f"backends/{folder}")
        if count != 1:
            errors.append(f"backends/{folder} appears {count} times in ci/matrix.json (expected exactly once)")
    fail_if(errors)


def test_device_values():
    bad = [(name_of(e), e.get("device")) for e in load_matrix() if e.get("device") not in DEVICES]
    assert not bad, f"device must be one of {sorted(DEVICES)}: {bad}"


def test_runs_on_non_empty():
    errors = []
    for entry in load_matrix():
        runs_on = entry.get("runs_on")
        if not isinstance(runs_on, list) or not runs_on:
            errors.append(f"{name_of(entry)}: runs_on must be a non-empty list of labels")
        elif not all(isinstance(label, str) and label.strip() for label in runs_on):
            errors.append(f"{name_of(entry)}: runs_on has empty/non-string labels: {runs_on}")
    fail_if(errors)


def test_cross_compile_targets_parse():
    errors = []
    for entry in load_matrix():
        targets = entry.get("cross_compile_targets")
        if not isinstance(targets, list):
            errors.append(f"{name_of(entry)}: cross_compile_targets must be a list")
            continue
        for t in targets:
            if not isinstance(t, str) or not TARGET_RE.match(t):
                errors.append(f"{name_of(entry)}: bad target {t!r} (want cuda:<int> or hip:gfx<alnum>)")
        if len(set(targets)) != len(targets):
            errors.append(f"{name_of(entry)}: duplicate targets {targets}")
    fail_if(errors)


def test_vendor_requirements_do_not_mention_torch_or_triton():
    """Vendor builds (cuda/rocm/ascend images) must never be replaced from PyPI."""
    errors = []
    checked = 0
    for entry in load_matrix():
        if entry.get("device") == "cpu":
            continue
        req = REPO_ROOT / entry.get("env_dir", "") / "requirements.txt"
        if not req.is_file():
            errors.append(f"{name_of(entry)}: {req.relative_to(REPO_ROOT)} missing")
            continue
        checked += 1
        for lineno, line in enumerate(req.read_text().splitlines(), 1):
            low = line.lower()
            for word in ("torch", "triton"):
                if word in low:
                    errors.append(f"{req.relative_to(REPO_ROOT)}:{lineno} mentions {word!r}: {line.strip()!r}")
            stripped = low.strip()
            if stripped.startswith(("-r", "--requirement", "-c", "--constraint", "-e", "--editable")):
                errors.append(f"{req.relative_to(REPO_ROOT)}:{lineno} includes other files/packages: {line.strip()!r}")
    assert checked, "no non-cpu backend in ci/matrix.json"
    fail_if(errors)


def test_cpu_requirements_install_torch_and_triton():
    errors = []
    for entry in load_matrix():
        if entry.get("device") != "cpu":
            continue
        req = REPO_ROOT / entry.get("env_dir", "") / "requirements.txt"
        lines = [l.split("#", 1)[0].strip() for l in req.read_text().splitlines()] if req.is_file() else []
        names = {re.split(r"[<>=!~\[; ]", l, maxsplit=1)[0].lower() for l in lines if l}
        for pkg in ("torch", "triton"):
            if pkg not in names:
                errors.append(f"{name_of(entry)}: requirements.txt does not install {pkg}")
    fail_if(errors)


def test_backend_json_matches_matrix():
    errors = []
    for entry in load_matrix():
        path = REPO_ROOT / entry.get("env_dir", "") / "backend.json"
        if not path.is_file():
            errors.append(f"{name_of(entry)}: backend.json missing")
            continue
        meta = json.loads(path.read_text())
        for field in ("name", "torch_device", "triton_backend", "device_check", "shell_setup", "vendor_setup"):
            if not isinstance(meta.get(field), str):
                errors.append(f"{name_of(entry)}: backend.json field {field!r} missing or not a string")
        if meta.get("name") != name_of(entry):
            errors.append(f"{name_of(entry)}: backend.json name is {meta.get('name')!r}")
        if meta.get("torch_device") != entry.get("device"):
            errors.append(f"{name_of(entry)}: backend.json torch_device {meta.get('torch_device')!r} != matrix device {entry.get('device')!r}")
        allowed = TRITON_BACKENDS.get(entry.get("device"), set())
        tb = meta.get("triton_backend")
        if tb not in allowed:
            errors.append(f"{name_of(entry)}: triton_backend {tb!r} not valid for device {entry.get('device')!r} ({sorted(allowed)})")
        if tb in REQUIRE_DEVICE and entry.get("require_device") != REQUIRE_DEVICE[tb]:
            errors.append(f"{name_of(entry)}: require_device should be {REQUIRE_DEVICE[tb]!r} for triton_backend {tb!r}, got {entry.get('require_device')!r}")
        for needle in DEVICE_CHECK_NEEDS.get(tb, ()):
            if needle not in (meta.get("device_check") or ""):
                errors.append(f"{name_of(entry)}: device_check does not contain {needle!r}")
    fail_if(errors)


def test_containers_and_hosts():
    """Container entries use the same image as their Containerfile; host entries
    run on GitHub-hosted runners with an explicit Python."""
    errors = []
    for entry in load_matrix():
        container = entry.get("container")
        containerfile = REPO_ROOT / entry.get("env_dir", "") / "Containerfile"
        text = containerfile.read_text() if containerfile.is_file() else ""
        if container is None:
            if not entry.get("python"):
                errors.append(f"{name_of(entry)}: host job (container null) needs a python version")
            if not all(l.startswith(GITHUB_HOSTED_PREFIXES) for l in entry.get("runs_on", [])):
                errors.append(f"{name_of(entry)}: host job should run on GitHub-hosted labels, got {entry.get('runs_on')}")
            continue
        image = container.get("image")
        if not isinstance(image, str) or not image:
            errors.append(f"{name_of(entry)}: container.image missing")
            continue
        if set(container) - {"image", "options"}:
            errors.append(f"{name_of(entry)}: unexpected container keys {sorted(set(container) - {'image', 'options'})}")
        if "self-hosted" not in entry.get("runs_on", []):
            errors.append(f"{name_of(entry)}: device container jobs need a self-hosted runner")
        m = re.search(r"^ARG BASE_IMAGE=(\S+)\s*$", text, re.M)
        if not m:
            errors.append(f"{name_of(entry)}: Containerfile has no 'ARG BASE_IMAGE=<image>' line")
        elif m.group(1) != image:
            errors.append(f"{name_of(entry)}: matrix image {image!r} != Containerfile BASE_IMAGE {m.group(1)!r}")
        options = container.get("options") or ""
        if entry.get("device") == "cuda" and meta_backend(entry) == "cuda" and "--gpus" not in options:
            errors.append(f"{name_of(entry)}: NVIDIA container needs --gpus")
        if meta_backend(entry) == "hip" and not all(d in options for d in ("/dev/kfd", "/dev/dri")):
            errors.append(f"{name_of(entry)}: ROCm container needs /dev/kfd and /dev/dri")
        if entry.get("device") == "npu" and not all(
            d in options for d in ("/dev/davinci_manager", "/dev/devmm_svm", "/dev/hisi_hdc", "/usr/local/Ascend/driver")
        ):
            errors.append(f"{name_of(entry)}: Ascend container needs the davinci devices and the driver mount")
    fail_if(errors)


def meta_backend(entry):
    path = REPO_ROOT / entry.get("env_dir", "") / "backend.json"
    return json.loads(path.read_text()).get("triton_backend") if path.is_file() else None


def test_validate_and_vendor_flags_follow_device():
    errors = []
    for entry in load_matrix():
        on_device = entry.get("device") != "cpu"
        if entry.get("validate") is not on_device:
            errors.append(f"{name_of(entry)}: validate should be {on_device} (on-device validation runs on GPU/NPU backends)")
        if entry.get("vendor_torch") is not on_device:
            errors.append(f"{name_of(entry)}: vendor_torch should be {on_device}")
    fail_if(errors)


def test_triton_versions():
    """The Triton-version axis: plain release versions, oldest first, only where we install
    Triton ourselves (the vendor images bring theirs), starting at the oldest the package
    supports (pyproject's lower bound) and each a job of its own."""
    bound = re.search(r'^cpu = \["triton>=([0-9.]+)"\]', PYPROJECT_PATH.read_text(), re.M)
    assert bound, "pyproject.toml: no lower bound on triton in the cpu extra"
    errors = []
    for entry in load_matrix():
        versions = entry.get("triton_versions")
        if not isinstance(versions, list):
            continue
        if entry.get("vendor_torch") and versions:
            errors.append(f"{name_of(entry)}: triton_versions must be empty: the vendor image brings its Triton")
        if not versions:
            continue
        bad = [v for v in versions if not isinstance(v, str) or not VERSION_RE.match(v)]
        if bad:
            errors.append(f"{name_of(entry)}: triton_versions {bad} are not X.Y.Z releases")
            continue
        if [release(v) for v in versions] != sorted({release(v) for v in versions}):
            errors.append(f"{name_of(entry)}: triton_versions {versions} should be distinct, oldest first")
        if release(versions[0])[:2] != release(bound.group(1))[:2]:
            errors.append(f"{name_of(entry)}: the oldest Triton {versions[0]} is not the supported minimum "
                          f"{bound.group(1)} (pyproject.toml)")
    assert any(entry.get("triton_versions") for entry in load_matrix()), "no entry has a Triton-version axis"
    fail_if(errors)


def test_the_ascend_lowering_runs_in_one_host_job():
    """tests/test_ascend_lowering.py lowers the Ascend kernels with triton-ascend in a venv of its
    own (ci/ascend_lowering.sh), the same whatever the job's Triton: one job runs it, a host job
    (the vendor images own their Python environment), and the workflow makes the venv and names
    it in PORTABLE_SOFTMAX_ASCEND_VENV there, or the test skips."""
    lowering = [job for job in expand_matrix(load_matrix()) if job.get("ascend_lowering")]
    assert len(lowering) == 1, [(job["backend"], job["triton"]) for job in lowering]
    assert lowering[0]["container"] is None and not lowering[0]["vendor_torch"]
    text = read_workflow()
    step = re.search(r"if: \$\{\{ matrix\.ascend_lowering \}\}\n(.*?)\n      - ", text, re.S)
    assert step, "no workflow step runs under matrix.ascend_lowering"
    assert "bash ci/ascend_lowering.sh" in step.group(1)
    assert 'PORTABLE_SOFTMAX_ASCEND_VENV=' in step.group(1) and "GITHUB_ENV" in step.group(1)


def test_expanded_jobs_are_distinct():
    jobs = [(job["backend"], job["triton"]) for job in expand_matrix(load_matrix())]
    assert len(jobs) == len(set(jobs)), f"duplicate jobs: {jobs}"


@pytest.mark.skipif(shutil.which("jq") is None, reason="jq not installed")
def test_expand_matrix_jq_matches():
    """What the workflow's matrix job emits (ci/expand_matrix.jq) is what these checks check."""
    result = subprocess.run(["jq", "-c", "-f", str(EXPAND_PATH), str(MATRIX_PATH)], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == expand_matrix(load_matrix())


def read_workflow():
    assert WORKFLOW_PATH.is_file(), f"{WORKFLOW_PATH} is missing"
    return WORKFLOW_PATH.read_text()


def test_workflow_is_driven_by_matrix_json():
    text = read_workflow()
    needles = [
        "ci/matrix.json",
        "fromJSON(needs.matrix.outputs.matrix)",
        "jq -c -f ci/expand_matrix.jq ci/matrix.json",
        "runs-on: ${{ matrix.runs_on }}",
        "container: ${{ matrix.container }}",
        "fail-fast: false",
        "PORTABLE_SOFTMAX_REQUIRE_DEVICE=${{ matrix.require_device }} python -m pytest tests",
        "portable-softmax compile --target",
        "portable-softmax validate --out validate-report",
        "actions/upload-artifact@",
    ]
    missing = [n for n in needles if n not in text]
    assert not missing, f"{WORKFLOW_PATH.relative_to(REPO_ROOT)} lacks: {missing}"
    # ONE parametrized test job, not one copy per backend
    for entry in load_matrix():
        image = (entry.get("container") or {}).get("image")
        if image:
            assert image not in text, f"image {image!r} is hard-coded in the workflow; keep it in ci/matrix.json"


def test_workflow_matrix_keys_exist_in_every_entry():
    expressions = re.findall(r"\$\{\{(.*?)\}\}", read_workflow(), re.S)
    # "matrix.<key>" not preceded by "." (needs.matrix.outputs is the job named matrix)
    used = {k for expr in expressions for k in re.findall(r"(?<![\w.])matrix\.([A-Za-z_][A-Za-z0-9_-]*)", expr)}
    assert used, "workflow does not use the matrix context"
    errors = [f"{name_of(e)}: workflow uses matrix.{k} but the job has no {k!r}" for e in expand_matrix(load_matrix())
              for k in sorted(used) if k not in e]
    fail_if(errors)


CHECK_JSONSCHEMA = importlib.util.find_spec("check_jsonschema") is not None


def run_check_jsonschema(path):
    return subprocess.run(
        [sys.executable, "-m", "check_jsonschema", "--builtin-schema", "vendor.github-workflows", str(path)],
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.skipif(not CHECK_JSONSCHEMA, reason="check_jsonschema not importable (pip install check-jsonschema)")
def test_workflow_schema_check_jsonschema(tmp_path):
    result = run_check_jsonschema(WORKFLOW_PATH)
    assert result.returncode == 0, f"check-jsonschema rejected the workflow:\n{result.stdout}\n{result.stderr}"
    # ...and the checker is able to fail: a copy with a misspelled key is rejected
    broken = tmp_path / "ci-broken.yml"
    text = read_workflow()
    assert "runs-on:" in text
    broken.write_text(text.replace("runs-on:", "runs_on:"))
    result = run_check_jsonschema(broken)
    assert result.returncode != 0, "check-jsonschema accepted a workflow with 'runs_on' instead of 'runs-on'"
