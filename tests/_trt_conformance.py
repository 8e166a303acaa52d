"""API conformance of trtrepo's TensorRT adapter against the REAL TensorRT Python bindings.

Run in a subprocess with the real ``tensorrt_bindings`` importable (stub libraries on LD_LIBRARY_PATH, see
scripts/setup_trt_bindings.sh); the two TensorRT versions cannot share one process::

    python tests/_trt_conformance.py ROUTE --models DIR [--mutate OLD NEW]   -> one JSON line on stdout

The route runs trtrepo's real code (``trtrepo.engine.build_engine`` with ``TensorRTEngineBuilder``) against
a *checking proxy* of the ``tensorrt`` module. Every attribute the code touches is looked up in the real
bindings first (module attribute, class attribute, enum member, method, property and whether it can be
set); every call is matched against the pybind signatures in the real ``__doc__`` (argument count,
keyword names, and the kinds of the arguments: int, bool, str, buffer, sequence, enum type, class); classes
the code derives from a TensorRT class (the logger, the calibrator) must override only methods the real
base has, with the same number of parameters. The *values* come from the fake TensorRT in
tests/_fake_tensorrt.py (nothing can be built without the libraries), so the list of checked accesses is
whatever the code does, not a hand-written list.

``--mutate OLD NEW`` replaces a string in the source of the trtrepo/engine/ module that holds it before running it (the tests use it to
show that a misspelled attribute is caught).
"""

from __future__ import annotations

import argparse
import importlib
import json
import re
import sys
import tempfile
import traceback
import types
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))


class ConformanceError(BaseException):
    """Raised at the first access that does not fit the real bindings (BaseException: code under test that
    catches Exception must not swallow it)."""


# ------------------------------------------------------------------------------------------------
# pybind signatures from __doc__


def _split_top(text: str) -> list[str]:
    parts, depth, cur = [], 0, []
    for ch in text:
        if ch in "[(<{":
            depth += 1
        elif ch in "])>}":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append("".join(cur).strip())
            cur = []
        else:
            cur.append(ch)
    if "".join(cur).strip():
        parts.append("".join(cur).strip())
    return parts


class Param:
    def __init__(self, text: str) -> None:
        name, _, rest = text.partition(":")
        self.name = name.strip()
        ptype, eq, _default = rest.partition("=")
        self.type = ptype.strip()
        self.has_default = bool(eq)

    def __repr__(self) -> str:
        return f"{self.name}: {self.type}{' = ...' if self.has_default else ''}"


class Signature:
    def __init__(self, params: list[Param], returns: str, text: str) -> None:
        self.params, self.returns, self.text = params, returns, text


def signatures(doc: str | None, name: str) -> list[Signature]:
    sigs = []
    pattern = re.compile(r"^\s*(?:\d+\.\s*)?" + (re.escape(name) if name else "") + r"\((.*)\)\s*->\s*(.+?)\s*$")
    for line in (doc or "").splitlines():
        if "*args" in line:
            continue
        m = pattern.match(line)
        if m:
            params = [Param(p) for p in _split_top(m.group(1))]
            sigs.append(Signature(params, m.group(2), line.strip()))
    return sigs


# ------------------------------------------------------------------------------------------------
# The checker


class Checker:
    def __init__(self, real: types.ModuleType, fake: types.ModuleType) -> None:
        self.real, self.fake = real, fake
        self.accessed: set[str] = set()
        self.violations: list[str] = []
        self.fake_to_real: dict[type, type] = {}
        self.checked_subclasses: set[type] = set()

    def fail(self, msg: str) -> None:
        self.violations.append(msg)
        raise ConformanceError(msg)

    # -- type resolution
    def resolve(self, type_name: str) -> Any:
        name = type_name.strip()
        for prefix in ("tensorrt_bindings.tensorrt.", "tensorrt.tensorrt.", "tensorrt."):
            if name.startswith(prefix):
                obj: Any = self.real
                for part in name[len(prefix):].split("."):
                    obj = getattr(obj, part, None)
                    if obj is None:
                        return None
                return obj
        return None

    def is_enum(self, cls: Any) -> bool:
        return isinstance(cls, type) and hasattr(cls, "__members__")

    def real_type_of(self, value: Any) -> type | None:
        if isinstance(value, InstanceProxy):
            return value._real_cls
        if isinstance(value, EnumProxy):
            return type(value._real)
        for klass in type(value).__mro__:
            if klass in self.fake_to_real:
                real_cls = self.fake_to_real[klass]
                if klass is not type(value):
                    self.check_subclass(type(value), klass, real_cls)
                return real_cls
        return None

    def check_subclass(self, sub: type, fake_base: type, real_base: type) -> None:
        """A Python class derived from a TensorRT class: what it overrides must exist in the real base."""
        if sub in self.checked_subclasses:
            return
        self.checked_subclasses.add(sub)
        for klass in sub.__mro__:
            if klass is fake_base:
                break
            for attr, fn in vars(klass).items():
                if attr.startswith("__") and attr != "__init__" or not callable(fn):
                    continue
                if attr.startswith("_") and attr != "__init__":
                    continue
                self.accessed.add(f"{real_base.__name__}.{attr} (override)")
                if attr == "__init__":
                    continue
                real_fn = getattr(real_base, attr, None)
                if real_fn is None:
                    self.fail(f"{sub.__name__}.{attr} overrides nothing: {real_base.__name__} has no '{attr}' in TensorRT {self.real.__version__}")
                sigs = signatures(real_fn.__doc__, attr)
                nparams = fn.__code__.co_argcount
                if sigs and not any(len(s.params) == nparams for s in sigs):
                    self.fail(f"{sub.__name__}.{attr} takes {nparams} parameters, TensorRT {self.real.__version__} calls "
                              f"{' | '.join(s.text for s in sigs)}")

    # -- argument kinds
    def type_ok(self, ptype: str, value: Any) -> bool:
        t = ptype.strip()
        raw = value._fake if isinstance(value, (InstanceProxy, EnumProxy)) else value
        if t in ("int", "typing.SupportsInt"):
            return isinstance(raw, int) and not isinstance(raw, bool) and not isinstance(value, EnumProxy) and not hasattr(raw, "name")
        if t in ("float", "typing.SupportsFloat"):
            return isinstance(raw, (int, float)) and not isinstance(raw, bool)
        if t == "bool":
            return isinstance(raw, bool)
        if t == "str":
            return isinstance(raw, str)
        if t in ("buffer", "typing_extensions.Buffer", "collections.abc.Buffer"):
            return isinstance(raw, (bytes, bytearray, memoryview))
        if re.match(r"^(typing\.)?(List|list|collections\.abc\.Sequence|Sequence)\[", t):
            return isinstance(raw, (list, tuple))
        if t == "object":
            return True
        cls = self.resolve(t)
        if cls is None:
            return True  # a C++ type name pybind did not translate: not checkable, accepted
        if cls.__name__.startswith("Dims") or cls.__name__ == "Permutation":
            return isinstance(raw, (list, tuple)) and all(isinstance(d, int) for d in raw) or self.real_type_of(value) is cls
        rt = self.real_type_of(value)
        return rt is not None and issubclass(rt, cls)

    def check_call(self, where: str, sigs: list[Signature], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Signature:
        if not sigs:
            self.fail(f"{where}: no pybind signature found in the real __doc__ to check the call against")
        reasons = []
        for sig in sigs:
            reason = self._fits(sig, args, kwargs)
            if reason is None:
                return sig
            reasons.append(f"{sig.text} ({reason})")
        self.fail(f"{where}{_show(args, kwargs)} does not fit TensorRT {self.real.__version__}: " + " | ".join(reasons))
        raise AssertionError  # unreachable

    def _fits(self, sig: Signature, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str | None:
        params = sig.params
        if len(args) > len(params):
            return f"{len(args)} positional arguments for {len(params)} parameters"
        filled = {p.name: a for p, a in zip(params, args, strict=False)}
        for k, v in kwargs.items():
            if k not in {p.name for p in params}:
                return f"no parameter '{k}'"
            if k in filled:
                return f"'{k}' given twice"
            filled[k] = v
        for p in params:
            if p.name not in filled:
                if not p.has_default:
                    return f"missing '{p.name}'"
                continue
            if not self.type_ok(p.type, filled[p.name]):
                return f"'{p.name}' expects {p.type}, got {_kind(filled[p.name])}"
        return None

    # -- results
    def wrap_result(self, returns: str, value: Any) -> Any:
        if value is None:
            return None
        cls = self.resolve(returns)
        if cls is None:
            cls = getattr(self.real, type(value).__name__, None) if hasattr(type(value), "__module__") else None
            if not isinstance(cls, type) or type(value).__name__ in ("int", "str", "bool", "list", "tuple", "bytes", "float"):
                return value
        if self.is_enum(cls):
            return EnumProxy(self, getattr(cls, value.name), value)
        if cls.__name__.startswith("Dims") or cls.__name__ == "IHostMemory":
            return value
        return InstanceProxy(self, cls, value)

    def wrap_attr(self, real_attr: Any, fake_attr: Any, qual: str) -> Any:
        if isinstance(real_attr, type):
            return ClassProxy(self, real_attr, fake_attr, qual)
        if type(real_attr).__name__ and self.is_enum(type(real_attr)) and hasattr(real_attr, "name"):
            return EnumProxy(self, real_attr, fake_attr)
        if callable(real_attr):
            return FunctionProxy(self, real_attr, fake_attr, qual)
        return fake_attr


def _kind(v: Any) -> str:
    if isinstance(v, InstanceProxy):
        return v._real_cls.__name__
    if isinstance(v, EnumProxy):
        return f"{type(v._real).__name__}.{v._real.name}"
    return type(v).__name__


def _show(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    return "(" + ", ".join([_kind(a) for a in args] + [f"{k}={_kind(v)}" for k, v in kwargs.items()]) + ")"


def _unwrap(v: Any) -> Any:
    if isinstance(v, (InstanceProxy, EnumProxy)):
        return v._fake
    if isinstance(v, ClassProxy):
        return v._fake
    if isinstance(v, list):
        return [_unwrap(x) for x in v]
    if isinstance(v, tuple):
        return tuple(_unwrap(x) for x in v)
    return v


class ModuleProxy:
    def __init__(self, checker: Checker) -> None:
        object.__setattr__(self, "_c", checker)

    def __getattr__(self, name: str) -> Any:
        c: Checker = self._c
        c.accessed.add(f"tensorrt.{name}")
        if not hasattr(c.real, name):
            c.fail(f"tensorrt.{name} does not exist in TensorRT {c.real.__version__}")
        real_attr = getattr(c.real, name)
        if name == "__version__":
            return real_attr
        fake_attr = getattr(c.fake, name)
        return c.wrap_attr(real_attr, fake_attr, name)


class ClassProxy:
    def __init__(self, checker: Checker, real_cls: type, fake_cls: Any, qual: str) -> None:
        self._c, self._real_cls, self._fake, self._qual = checker, real_cls, fake_cls, qual
        if isinstance(fake_cls, type):
            checker.fake_to_real.setdefault(fake_cls, real_cls)

    def __mro_entries__(self, bases: tuple[Any, ...]) -> tuple[type, ...]:
        return (self._fake,)

    def __getattribute__(self, name: str) -> Any:
        if name == "__init__":  # ``Base.__init__(self)`` must reach the TensorRT class, not this proxy's own
            return ClassProxy.__getattr__(self, name)
        return object.__getattribute__(self, name)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        c = self._c
        c.accessed.add(f"{self._qual}()")
        sigs = signatures(self._real_cls.__init__.__doc__, "__init__")
        c.check_call(f"{self._qual}()", [Signature(s.params[1:], s.returns, s.text) for s in sigs], args, kwargs)
        return InstanceProxy(c, self._real_cls, self._fake(*_unwrap(args), **{k: _unwrap(v) for k, v in kwargs.items()}))

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_") and name not in ("__init__",):
            raise AttributeError(name)
        c = self._c
        qual = f"{self._qual}.{name}"
        c.accessed.add(qual)
        if not hasattr(self._real_cls, name):
            c.fail(f"{qual} does not exist in TensorRT {c.real.__version__}")
        real_attr = getattr(self._real_cls, name)
        fake_attr = getattr(self._fake, name)
        if isinstance(real_attr, type):
            return ClassProxy(c, real_attr, fake_attr, qual)
        if c.is_enum(type(real_attr)) and hasattr(real_attr, "name"):
            return EnumProxy(c, real_attr, fake_attr)
        if callable(real_attr):  # unbound method: the instance is the first argument
            return MethodProxy(c, real_attr, fake_attr, qual, bound_self=None, name=name)
        return fake_attr


class FunctionProxy:
    def __init__(self, checker: Checker, real_fn: Any, fake_fn: Any, qual: str) -> None:
        self._c, self._real, self._fake, self._qual = checker, real_fn, fake_fn, qual

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        sig = self._c.check_call(self._qual, signatures(self._real.__doc__, self._qual.rsplit(".", 1)[-1]), args, kwargs)
        return self._c.wrap_result(sig.returns, self._fake(*_unwrap(args), **{k: _unwrap(v) for k, v in kwargs.items()}))


class MethodProxy:
    def __init__(self, checker: Checker, real_fn: Any, fake_fn: Any, qual: str, bound_self: Any, name: str) -> None:
        self._c, self._real, self._fake, self._qual, self._self, self._name = checker, real_fn, fake_fn, qual, bound_self, name

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        c = self._c
        sigs = signatures(self._real.__doc__, self._name)
        if self._self is not None:
            sig = c.check_call(self._qual, [Signature(s.params[1:], s.returns, s.text) for s in sigs], args, kwargs)
        else:
            sig = c.check_call(self._qual, sigs, args, kwargs)
        result = self._fake(*_unwrap(args), **{k: _unwrap(v) for k, v in kwargs.items()})
        return c.wrap_result(sig.returns, result)


class InstanceProxy:
    def __init__(self, checker: Checker, real_cls: type, fake_obj: Any) -> None:
        object.__setattr__(self, "_c", checker)
        object.__setattr__(self, "_real_cls", real_cls)
        object.__setattr__(self, "_fake", fake_obj)

    def _lookup(self, name: str) -> Any:
        c: Checker = self._c
        qual = f"{self._real_cls.__name__}.{name}"
        c.accessed.add(qual)
        if not hasattr(self._real_cls, name):
            c.fail(f"{qual} does not exist in TensorRT {c.real.__version__}")
        return qual, getattr(self._real_cls, name)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        c: Checker = self._c
        qual, real_attr = self._lookup(name)
        if isinstance(real_attr, property):
            value = getattr(self._fake, name)
            sigs = signatures(real_attr.fget.__doc__ if real_attr.fget else "", "")
            return c.wrap_result(sigs[0].returns, value) if sigs else value
        if callable(real_attr):
            return MethodProxy(c, real_attr, getattr(self._fake, name), qual, bound_self=self, name=name)
        return getattr(self._fake, name)

    def __setattr__(self, name: str, value: Any) -> None:
        c: Checker = self._c
        qual, real_attr = self._lookup(name)
        if not isinstance(real_attr, property) or real_attr.fset is None:
            c.fail(f"{qual} cannot be assigned in TensorRT {c.real.__version__} (not a writable property)")
        sigs = signatures(real_attr.fset.__doc__, "")
        if sigs:
            c.check_call(f"{qual} =", [Signature(s.params[1:], s.returns, s.text) for s in sigs], (value,), {})
        setattr(self._fake, name, _unwrap(value))

    def __bool__(self) -> bool:
        return True


class EnumProxy:
    def __init__(self, checker: Checker, real_member: Any, fake_member: Any) -> None:
        self._c, self._real, self._fake = checker, real_member, fake_member
        if getattr(fake_member, "name", None) != real_member.name:
            checker.fail(f"fake enum member {fake_member} does not match {real_member}")

    def __int__(self) -> int:
        return int(self._real)

    @property
    def name(self) -> str:
        return self._real.name

    def __eq__(self, other: object) -> bool:
        if isinstance(other, EnumProxy):
            return type(self._real) is type(other._real) and self._real.name == other._real.name
        return NotImplemented

    def __hash__(self) -> int:
        return hash((type(self._real).__name__, self._real.name))


# ------------------------------------------------------------------------------------------------
# Routes


def run_route(route: str, trt_proxy: Any, work: Path, models: Path) -> dict[str, Any]:
    from _fake_tensorrt import FakeCudart

    from trtrepo.contracts.profile import BatchProfile
    from trtrepo.data import DataOptions
    from trtrepo.engine import BuildOptions, CudaRuntime, TensorRTEngineBuilder, build_engine

    fp32, qdq = models / "demo.onnx", models / "demo.qdq.onnx"
    builder = TensorRTEngineBuilder(trt_proxy, CudaRuntime(FakeCudart()))
    common = dict(workspace=1 << 30, opt_level=3, timing_cache=str(work / "timing.cache"))
    if route == "qdq":
        result = build_engine(qdq, work / "repo/m/1/model.plan", BuildOptions(**common), builder=builder)
    elif route == "legacy-entropy":
        result = build_engine(fp32, work / "repo/m/2/model.plan",
                              BuildOptions(legacy_calibrator="entropy", data=DataOptions("demo:calib", limit=32),
                                           calib_cache=str(work / "calib.cache"), **common), builder=builder)
    elif route == "legacy-minmax-cache":
        cache = work / "minmax.cache"
        cache.write_text("TRT-100300-MinMaxCalibration\ninput: 3c010204\n")
        result = build_engine(fp32, work / "repo/m/3/model.plan",
                              BuildOptions(legacy_calibrator="minmax", calib_cache=str(cache), **common), builder=builder)
    elif route == "qdq-fp16":
        result = build_engine(qdq, work / "repo/m/4/model.plan", BuildOptions(fp16=True, **common), builder=builder)
    elif route == "legacy-entropy-fp16":
        result = build_engine(fp32, work / "repo/m/5/model.plan",
                              BuildOptions(legacy_calibrator="entropy", fp16=True, data=DataOptions("demo:calib", limit=32),
                                           **common), builder=builder)
    elif route == "qdq-text-fp16":  # two inputs, dynamic batch and sequence (demo-text), mixed INT8+FP16
        from trtrepo.contracts.profile import parse_shape_option

        shapes = tuple(parse_shape_option(f"{n}:1x8,8x64,32x128") for n in ("input_ids", "attention_mask"))
        result = build_engine(models / "text.qdq.onnx", work / "repo/t/1/model.plan",
                              BuildOptions(fp16=True, profile=BatchProfile.for_build(shapes=shapes), **common), builder=builder)
    else:
        raise SystemExit(f"unknown route {route}")
    meta = result.metadata
    return {"plan": str(result.plan), "route": meta.precision_route, "precision": dict(meta.precision),
            "profile": {n: r.to_dict() for n, r in meta.profile.items()}, "trtexec": meta.trtexec}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("route")
    ap.add_argument("--models", required=True, help="folder with demo.onnx and demo.qdq.onnx (tests/_build_models.py)")
    ap.add_argument("--mutate", nargs=2, metavar=("OLD", "NEW"), default=None,
                    help="replace OLD by NEW in the source of the trtrepo/engine/ module holding it before running")
    args = ap.parse_args()

    import tensorrt_bindings as real
    from _fake_tensorrt import make_fake_tensorrt

    fake = make_fake_tensorrt(real.__version__)
    checker = Checker(real, fake)
    proxy = ModuleProxy(checker)
    if args.mutate:
        import pkgutil

        import trtrepo.engine as build_pkg

        old, new = args.mutate
        modules = [importlib.import_module(f"trtrepo.engine.{m.name}") for m in pkgutil.iter_modules(build_pkg.__path__)]
        hits = [m for m in modules if old in Path(m.__file__).read_text()]
        if len(hits) != 1:
            raise SystemExit(f"--mutate: '{old}' found in {len(hits)} modules of trtrepo/engine/ (expected 1)")
        mod = hits[0]
        before = dict(mod.__dict__)
        code = compile(Path(mod.__file__).read_text().replace(old, new), mod.__file__, "exec")
        exec(code, mod.__dict__)  # noqa: S102 - the test's deliberate misspelling
        # rebind what the package and the sibling modules imported from the mutated module
        for other in [build_pkg, *modules]:
            for name, value in list(vars(other).items()):
                if other is not mod and name in before and value is before[name]:
                    setattr(other, name, mod.__dict__[name])
    out: dict[str, Any] = {"tensorrt": real.__version__, "route": args.route}
    with tempfile.TemporaryDirectory() as tmp:
        try:
            out["result"] = run_route(args.route, proxy, Path(tmp), Path(args.models))
            out["error"] = None
        except ConformanceError:
            out["error"] = "conformance"
        except Exception as exc:  # a trtrepo error (e.g. the legacy route on TensorRT 11)
            out["error"] = f"{type(exc).__name__}: {exc}"
            out["traceback"] = traceback.format_exc()
    out["violations"] = checker.violations
    out["accessed"] = sorted(checker.accessed)
    print(json.dumps(out))


if __name__ == "__main__":
    importlib.invalidate_caches()
    main()
