"""The child program of :mod:`trtrepo.repository.loads`: loads model files with the runtime that
will serve them, one request at a time, in a process of its own.

Run as a script (``python loadprobe.py``), never imported: it imports nothing from trtrepo, so it
starts in the time Python and the runtime take (ONNX Runtime: about 0.15 s), and a runtime that
crashes, hangs or allocates without end takes only this process down. Requests arrive as JSON
lines on stdin, answers leave as JSON lines on the protocol descriptor (fd 1 at start, which is
then pointed at stderr so that nothing a native library prints can corrupt the answers):

request: ``{"runtime": "onnxruntime" | "tensorrt", "path": ..., "providers": [...],
"memory": bytes, "memory_kind": "as" | "data", "tensorrt_version": str | null}``;
answer: ``{"ok": bool, "error": str, "code": str, "missing": str, "version": str}`` (``missing``:
the providers asked for that this ONNX Runtime lacks; ``ok`` also where nothing could be tried).

Before each load the soft limit of the address space (``RLIMIT_AS``; ``RLIMIT_DATA`` where a GPU
provider reserves address space it never touches) is set to what the process uses now plus
``memory``, and put back after it: a model that asks for more fails to allocate here instead
of taking the machine's memory.
"""

import sys

del sys.path[0]  # the script's folder (trtrepo/repository/): none of its files may shadow what a runtime imports

import json  # noqa: E402
import os  # noqa: E402
import resource  # noqa: E402

_LIMITS = {"as": (resource.RLIMIT_AS, "VmSize"), "data": (resource.RLIMIT_DATA, "VmData")}


def _in_use(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    return 0


def _limit(kind, extra):
    """Lower the soft limit to what is in use now plus ``extra``; returns the limits to restore."""
    which, field = _LIMITS[kind]
    before = resource.getrlimit(which)
    soft = _in_use(field) + extra
    for bound in before:
        if bound != resource.RLIM_INFINITY:
            soft = min(soft, bound)
    resource.setrlimit(which, (soft, before[1]))
    return which, before


def _onnxruntime(req):
    import onnxruntime as ort

    ort.set_default_logger_severity(4)
    available = ort.get_available_providers()
    wanted = list(req["providers"]) or ["CPUExecutionProvider"]
    use = [p for p in wanted if p in available] or ["CPUExecutionProvider"]
    missing = [p for p in wanted if p not in available]
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    opts.inter_op_num_threads = 1
    opts.log_severity_level = 4
    answer = {"version": ort.__version__}
    try:
        session = ort.InferenceSession(req["path"], opts, providers=use)
    except MemoryError:
        return {**answer, "ok": False, "code": "MemoryError", "error": "std::bad_alloc"}
    except Exception as exc:  # the runtime's own error types (Fail, InvalidGraph, NotImplemented, ...)
        return {**answer, "ok": False, "code": type(exc).__name__, "error": str(exc), "missing": ", ".join(missing)}
    del session
    return {**answer, "ok": True, "missing": ", ".join(missing)}


def _tensorrt(req):
    try:
        import tensorrt as trt
    except ImportError:
        return {"ok": True}  # not installed here: nothing to try
    expected = req.get("tensorrt_version")
    if expected and trt.__version__ != expected:
        return {"ok": True, "version": trt.__version__}  # a plan loads only with its own version: not tried
    errors = []

    class Logger(trt.ILogger):
        def __init__(self):
            trt.ILogger.__init__(self)

        def log(self, severity, msg):  # severities by name, as trtrepo.engine.routes.make_logger reads them
            if getattr(severity, "name", str(severity)) in ("INTERNAL_ERROR", "ERROR"):
                errors.append(str(msg).strip())

    try:
        runtime = trt.Runtime(Logger())
    except Exception:  # no GPU or driver: nothing to deserialise on
        return {"ok": True, "version": trt.__version__}
    with open(req["path"], "rb") as f:
        engine = runtime.deserialize_cuda_engine(f.read())
    if engine is None:
        return {"ok": False, "version": trt.__version__, "code": "deserialize",
                "error": errors[-1] if errors else "deserialize_cuda_engine returned no engine"}
    return {"ok": True, "version": trt.__version__}


def main():
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    for line in sys.stdin:
        req = json.loads(line)
        if req["runtime"] == "onnxruntime":
            import onnxruntime  # noqa: F401  # imported before the limit: the limit is the load's alone
        which, before = _limit(req.get("memory_kind", "as"), int(req["memory"]))
        try:
            answer = (_tensorrt if req["runtime"] == "tensorrt" else _onnxruntime)(req)
        finally:
            resource.setrlimit(which, before)
        out.write(json.dumps(answer) + "\n")
        out.flush()


if __name__ == "__main__":
    main()
