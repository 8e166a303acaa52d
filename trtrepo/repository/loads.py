"""A model must load before it lands: the model file of a config tried with the runtime that will
serve it (the backend's :attr:`~trtrepo.contracts.backends.BackendSpec.runtime`), before anything
is written (:func:`check_model_loads`: ``repo add``, ``deploy``, ``tune --apply``, through
:func:`trtrepo.repository.add_model` and :func:`trtrepo.repository.replace_config`), and again for
what a repository holds (:func:`runtime_problems`: ``repo check``).

Why: tritonserver loads every model of a repository at start and does not start while one fails,
so one model ONNX Runtime cannot load (a cycle, an op of an unknown domain, opset 99, an
initializer declared without its data, bfloat16 where no kernel takes it) takes the good models
down with it. The ONNX checker accepts some of these; only the runtime knows.

How: ONNX Runtime creates an ``InferenceSession`` with the target's providers (the Python
backend's ``model.py`` uses the CPU provider; an ONNX Runtime model on ``KIND_GPU`` adds CUDA, and
TensorRT where the config names that accelerator): a provider missing here is left out, and a
missing kernel is then only a warning (the GPU may have it). A TensorRT plan is deserialised where
TensorRT of the plan's version (``model.plan.json``) and a GPU are here, else not tried.

Where: in a child process (``loadprobe.py`` beside this module, which imports nothing from
trtrepo), so that a runtime that crashes, hangs or allocates without end costs a one-line refusal,
not trtrepo: each load runs under a memory limit (:data:`MEMORY_BASE` plus
:data:`MEMORY_PER_BYTE` times the version folder's bytes, ``RLIMIT_AS``) and a timeout
(:data:`LOAD_TIMEOUT_S`, plus :data:`TIMEOUT_PER_GIB` per GiB); the child is started on the first
check of a process and kept for the next ones (Python and ONNX Runtime start once), replaced after
a crash or a timeout. Cost: docs/benchmarks.md, "Issue 39: the load check".

Types the backend cannot carry at all (``unsupported_types``: bfloat16 through the Python backend)
are refused first, naming the tensor (:func:`type_problem`).
"""

from __future__ import annotations

import atexit
import contextlib
import importlib.util
import json
import os
import re
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..contracts import backends
from ..contracts.plan import PlanMetadata, read_plan_metadata
from ..errors import UsageError
from ..fsutil import temp_dir
from ..modelio import load_onnx
from .layout import FileSource, read_config, served_versions, versions_of

PROBE = Path(__file__).with_name("loadprobe.py")
LOAD_TIMEOUT_S = 120.0  # a model of a few MB loads in well under a second
TIMEOUT_PER_GIB = 60.0
MEMORY_BASE = 1 << 30  # bytes a load may allocate on top of what the child holds, plus ...
MEMORY_PER_BYTE = 4  # ... this many times the bytes of the version folder's files
_GPU_PROVIDERS = ("TensorrtExecutionProvider", "CUDAExecutionProvider")


@dataclass(frozen=True)
class LoadCheck:
    """One model file and how it is loaded: ``runtime`` (``onnxruntime`` / ``tensorrt``), the ONNX
    Runtime ``providers`` of the target, the TensorRT version a plan needs, the memory (bytes) and
    time (seconds) the load may take."""

    path: Path
    runtime: str
    providers: tuple[str, ...] = ("CPUExecutionProvider",)
    tensorrt_version: str | None = None
    memory: int = MEMORY_BASE
    timeout_s: float = LOAD_TIMEOUT_S


@dataclass(frozen=True)
class LoadResult:
    """``error``: why the file does not load, one line (None: it loaded, or could not be tried
    here: TensorRT missing, or of another version than the plan's); ``warning``: a failure that
    may be this machine's alone (a kernel missing once the target's GPU provider, absent here, is
    left out); ``runtime``: the runtime and version that tried it."""

    error: str | None = None
    warning: str | None = None
    runtime: str = ""


class _Probe:
    """The child process (``loadprobe.py``), started on first use, one request at a time."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen[bytes] | None = None
        self.pid = 0  # the process that started ``proc`` (a forked copy starts its own)
        self.lock = threading.Lock()
        self.buffer = b""

    def _process(self) -> subprocess.Popen[bytes]:
        if self.proc is None or self.pid != os.getpid() or self.proc.poll() is not None:
            if self.proc is not None and self.pid == os.getpid():
                self.stop()
            self.proc = subprocess.Popen([sys.executable, str(PROBE)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         stderr=subprocess.DEVNULL)
            self.pid, self.buffer = os.getpid(), b""
        return self.proc

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None or self.pid != os.getpid():
            return
        with contextlib.suppress(OSError):
            proc.kill()
        proc.wait()
        for f in (proc.stdin, proc.stdout):
            with contextlib.suppress(OSError):
                f and f.close()

    def close(self) -> None:
        """At exit: the child ends when its stdin closes."""
        proc = self.proc
        if proc is None or self.pid != os.getpid():
            return
        with contextlib.suppress(OSError):
            proc.stdin and proc.stdin.close()
        try:
            proc.wait(timeout=2)
        except subprocess.TimeoutExpired:
            self.stop()

    def ask(self, request: Mapping[str, Any], timeout_s: float) -> dict[str, Any]:
        """The child's answer, or ``{"ok": False, "error": ...}`` when it died or took too long."""
        with self.lock:
            proc = self._process()
            assert proc.stdin is not None and proc.stdout is not None
            try:
                proc.stdin.write(json.dumps(request).encode() + b"\n")
                proc.stdin.flush()
            except OSError:
                pass  # it died: the read below sees the end of its output
            fd, deadline = proc.stdout.fileno(), time.monotonic() + timeout_s
            while b"\n" not in self.buffer:
                left = deadline - time.monotonic()
                if left <= 0 or not select.select([fd], [], [], left)[0]:
                    self.stop()
                    return {"ok": False, "error": f"it did not load within {timeout_s:.0f} s (the load was stopped)"}
                chunk = os.read(fd, 65536)
                if not chunk:
                    rc = proc.wait()
                    self.proc = None
                    how = f"signal {signal.Signals(-rc).name}" if rc < 0 and -rc in signal.valid_signals() else f"exit {rc}"
                    return {"ok": False, "error": f"the runtime crashed while loading it ({how})"}
                self.buffer += chunk
            line, _, self.buffer = self.buffer.partition(b"\n")
            answer: dict[str, Any] = json.loads(line)
            return answer


_PROBE = _Probe()
atexit.register(_PROBE.close)


def try_load(check: LoadCheck) -> LoadResult:
    """Load ``check.path`` with its runtime in the child process; nothing here raises for a file
    that does not load (that is the answer)."""
    gpu = check.runtime == "tensorrt" or any(p in _GPU_PROVIDERS for p in check.providers)
    request = {"runtime": check.runtime, "path": str(check.path), "providers": list(check.providers),
               "tensorrt_version": check.tensorrt_version, "memory": int(check.memory),
               # CUDA reserves address space it never touches: a GPU load is held to its data segment
               "memory_kind": "data" if gpu else "as"}
    answer = _PROBE.ask(request, check.timeout_s)
    label = {"onnxruntime": "ONNX Runtime", "tensorrt": "TensorRT"}.get(check.runtime, check.runtime)
    runtime = f"{label} {answer['version']}" if answer.get("version") else label
    if answer.get("ok"):
        return LoadResult(None, None, runtime)
    error = clean_error(str(answer.get("error", "")))
    if answer.get("code") == "MemoryError" or "bad_alloc" in error or "Failed to allocate memory" in error:
        error = f"it needs more than {check.memory / (1 << 20):.0f} MiB of memory to load (the check's limit)"
    if answer.get("missing") and answer.get("code") == "NotImplemented":
        # a kernel missing from the providers here, which the target's GPU provider may have
        return LoadResult(None, f"{answer['missing']} is not available here, and without it: {error}", runtime)
    return LoadResult(error, None, runtime)


_ORT_CODE = re.compile(r"^\[ONNXRuntimeError\]\s*:\s*\d+\s*:\s*\w+\s*:\s*")
_LOAD_FROM = re.compile(r"^Load model from .*? failed:\s*")
# "/onnxruntime_src/onnxruntime/core/graph/model_load_utils.h:46 void ns::F(const std::string&, int) "
_SOURCE = re.compile(r"\S+\.(?:h|hpp|cc|cpp|cu):\d+\s+(?:[^()]*?\((?:[^()]|\([^()]*\))*\)(?:\s*const)?\s*)?")


def clean_error(text: str, limit: int = 300) -> str:
    """One line of a runtime's error: without ONNX Runtime's status prefix, the path it repeats
    and the C++ source location; a long message keeps its first and last sentences."""
    text = " ".join(text.split())
    text = _LOAD_FROM.sub("", _ORT_CODE.sub("", text))
    text = _SOURCE.sub("", text).strip()
    if len(text) > limit:
        sentences = re.split(r"(?<=\.)\s+", text)
        if len(sentences) > 2:
            text = f"{sentences[0]} ... {sentences[-1]}"
        if len(text) > limit:
            text = text[:limit - 3] + "..."
    return text or "no reason given"


def _tensors(msg: Any) -> Iterable[tuple[str, str, str]]:
    """(``input``/``output``, name, Triton data type) of a parsed config."""
    for kind, tensors in (("input", msg.input), ("output", msg.output)):
        for t in tensors:
            yield kind, t.name, t.DESCRIPTOR.fields_by_name["data_type"].enum_type.values_by_number[t.data_type].name


def type_problem(spec: backends.BackendSpec, tensors: Iterable[tuple[str, str, str]]) -> str | None:
    """The first tensor among ``tensors`` ((``input``/``output``, name, Triton data type)) whose type
    ``spec``'s model cannot carry, as one line; None when every one fits."""
    for kind, name, dtype in tensors:
        if dtype in spec.unsupported_types:
            why = (" (it hands tensors over as numpy arrays, and numpy has no bfloat16)"
                   if spec.runs_python and dtype == "TYPE_BF16" else "")
            return (f"{kind} '{name}' is {dtype.removeprefix('TYPE_')}, which the {spec.name} backend cannot carry{why}; "
                    f"another backend, or float32/float16 inputs and outputs, can")
    return None


def providers(spec: backends.BackendSpec, *, gpu: bool = False, tensorrt_accelerator: bool = False) -> tuple[str, ...]:
    """The ONNX Runtime providers ``spec``'s served model runs with, on a GPU instance (``gpu``;
    ``KIND_AUTO`` falls back to the CPU, so it must load there) and with the TensorRT accelerator."""
    if spec.runs_python or not gpu:  # templates/python_onnx_model.py: CPUExecutionProvider only
        return ("CPUExecutionProvider",)
    return (("TensorrtExecutionProvider",) if tensorrt_accelerator else ()) + ("CUDAExecutionProvider", "CPUExecutionProvider")


def _providers(msg: Any, spec: backends.BackendSpec) -> tuple[str, ...]:
    names = {a.name for a in msg.optimization.execution_accelerators.gpu_execution_accelerator}
    return providers(spec, gpu=any(g.kind == g.KIND_GPU for g in msg.instance_group), tensorrt_accelerator="tensorrt" in names)


def runtime_files(msg: Any) -> tuple[backends.BackendSpec | None, list[str]]:
    """The backend of a parsed config and the files of a version folder its runtime loads: the
    ONNX file a Python model names (``onnx_filename``), the per-GPU plans, else the model file;
    no files when the backend has no :attr:`~trtrepo.contracts.backends.BackendSpec.runtime`."""
    spec = backends.for_config(msg.platform, msg.backend)
    if spec is None or spec.runtime is None:
        return spec, []
    if len(msg.cc_model_filenames):
        return spec, sorted(set(msg.cc_model_filenames.values()))
    if spec.runs_python:
        param = msg.parameters["onnx_filename"].string_value if "onnx_filename" in msg.parameters else ""
        return spec, [param or "model.onnx"]
    return spec, [msg.default_model_filename or spec.model_file or ""]


def _size(path: Path) -> int:
    with contextlib.suppress(OSError):
        if path.is_dir():
            return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
        return path.stat().st_size
    return 0


def _checks(msg: Any, files: Mapping[str, Path], plan: PlanMetadata | None) -> list[tuple[str, LoadCheck]]:
    """(name in the version folder, check) of each file ``msg``'s runtime loads among ``files``."""
    spec, names = runtime_files(msg)
    if spec is None or not names:
        return []
    size = sum(_size(p) for p in files.values())
    memory, timeout = MEMORY_BASE + MEMORY_PER_BYTE * size, LOAD_TIMEOUT_S + TIMEOUT_PER_GIB * size / (1 << 30)
    checks = []
    for name in names:
        if name not in files:
            continue  # a missing file is layout's finding (files_needed)
        if spec.runtime == "tensorrt":
            if not _tensorrt_here():
                continue  # nothing to deserialise with; the plan's metadata was read already
            checks.append((name, LoadCheck(files[name], "tensorrt", (), plan.tensorrt_version if plan else None,
                                           memory, timeout)))
        else:
            checks.append((name, LoadCheck(files[name], spec.runtime or "", _providers(msg, spec), None, memory, timeout)))
    return checks


def _tensorrt_here() -> bool:
    return importlib.util.find_spec("tensorrt") is not None


def _verdict(check: LoadCheck, shown: Any, tail: str) -> str | None:
    """Raise for a file that does not load; a warning for one not fully tried here; else None."""
    result = try_load(check)
    if result.error:
        raise UsageError(f"{shown}: {result.runtime} cannot load it: {result.error.rstrip('.')}{tail}")
    if result.warning:
        return f"{shown}: not fully checked: {result.runtime}: {result.warning}"
    return None


def check_file_loads(path: str | Path, spec: backends.BackendSpec, *, gpu: bool = False, shown: str | None = None,
                     what: str = "") -> list[str]:
    """Refuse (:class:`~trtrepo.errors.UsageError`) an ONNX file that ``spec``'s runtime does not load
    (``deploy`` checks its source this way before any work); ``shown`` names it in the message.
    Returns warnings, as :func:`check_model_loads`."""
    path = Path(path)
    if spec.runtime != "onnxruntime":
        return []
    model = load_onnx(path, load_weights=False)
    locations = {e.value for t in model.graph.initializer for e in t.external_data if e.key == "location"}
    size = _size(path) + sum(_size(path.parent / rel) for rel in locations)
    check = LoadCheck(path, "onnxruntime", providers(spec, gpu=gpu), None, MEMORY_BASE + MEMORY_PER_BYTE * size,
                      LOAD_TIMEOUT_S + TIMEOUT_PER_GIB * size / (1 << 30))
    warning = _verdict(check, shown or path, f"; {what}" if what else "")
    return [warning] if warning else []


def check_model_loads(msg: Any, version_files: Mapping[str, FileSource], *, plan: PlanMetadata | None = None,
                      what: str = "") -> list[str]:
    """Refuse (:class:`~trtrepo.errors.UsageError`, one line naming the model file) a model whose
    config ``msg`` (parsed) its backend cannot serve with ``version_files`` (name in the version
    folder -> source): a tensor type the backend cannot carry, a model file its runtime does not
    load. Returns warnings: what could not be tried here. ``what`` ends the message (``"model 'm'
    not written"``)."""
    spec, names = runtime_files(msg)
    tail = f"; {what}" if what else ""
    problem = type_problem(spec, _tensors(msg)) if spec is not None else None
    if problem:
        source = version_files.get(names[0]) if names else None
        raise UsageError(f"{source if isinstance(source, (str, Path)) else f'model {msg.name!r}'}: {problem}{tail}")
    warnings: list[str] = []
    with contextlib.ExitStack() as stack:
        paths = {rel: Path(src) for rel, src in version_files.items() if not isinstance(src, bytes)}
        given = {rel: src for rel, src in version_files.items() if isinstance(src, bytes) and rel in names}
        if given:  # a model file given as bytes: loaded from a file of a temporary folder
            folder = Path(stack.enter_context(temp_dir("loadcheck")))
            for rel, data in given.items():
                (folder / rel).parent.mkdir(parents=True, exist_ok=True)
                (folder / rel).write_bytes(data)
                paths[rel] = folder / rel
        for rel, check in _checks(msg, paths, plan):
            src = version_files[rel]
            warning = _verdict(check, rel if isinstance(src, bytes) else src, tail)
            if warning:
                warnings.append(warning)
    return warnings


def runtime_problems(repo: str | Path) -> list[tuple[Path, str]]:
    """``repo check``: (path, why) for each served model file in ``repo`` its runtime does not load,
    and each model with a tensor type its backend cannot carry. Folders without a readable config
    are :func:`~trtrepo.repository.load_problems`' findings, not repeated here."""
    repo = Path(repo)
    found: list[tuple[Path, str]] = []
    if not repo.is_dir():
        return found
    for d in sorted(p for p in repo.iterdir() if p.is_dir() and (p / "config.pbtxt").is_file()):
        try:
            msg = read_config(d)
        except UsageError:
            continue
        spec, _ = runtime_files(msg)
        if spec is None:
            continue
        problem = type_problem(spec, _tensors(msg))
        if problem:
            found.append((d / "config.pbtxt", problem))
            continue
        for v in served_versions(msg, versions_of(d)):
            vdir = d / str(v)
            files = {str(p.relative_to(vdir)): p for p in vdir.rglob("*") if p.is_file()}
            try:
                plan = read_plan_metadata(vdir / "model.plan", missing_ok=True) if spec.runtime == "tensorrt" else None
            except UsageError:
                plan = None  # unreadable metadata: repo check's note
            for rel, check in _checks(msg, files, plan):
                result = try_load(check)
                if result.error:
                    found.append((vdir / rel, f"{result.runtime} cannot load it: {result.error}"))
    return found
