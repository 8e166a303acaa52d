"""The usual models: from an ONNX file (:func:`add_onnx_model`: ONNX Runtime or the Python
backend running ONNX Runtime; external data files travel with it), from a TensorRT plan
(:func:`add_plan_model`, reading the builder's ``model.plan.json``), the image ensemble
(:func:`add_image_ensemble`) and the detector ensemble (:func:`add_detector_ensemble`)."""

from __future__ import annotations

import ast
import json
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from ..contracts import backends
from ..contracts.plan import plan_metadata_path, read_plan_metadata
from ..detect import YoloLayout
from ..errors import OptionError, UsageError
from ..modelio import ModelIO, TensorSpec, external_data_path, load_onnx
from ..tritonconfig import (
    ModelConfig,
    ModelOptions,
    NmsSettings,
    TensorConfig,
    config_from_io,
    detector_ensemble_config,
    ensemble_config,
    execution_env_files,
    parse_config_text,
    postprocess_config,
    preprocess_config,
    render_config,
    template_file,
    validate_config_text,
)
from .layout import FileSource, PlanTarget, WriteResult, check_plan_target, check_relpath
from .write import add_model, known_models


def labels_bytes(labels: Sequence[str] | str | Path) -> bytes:
    if isinstance(labels, (str, Path)):
        p = Path(labels)
        if not p.is_file():
            raise UsageError(f"{p}: labels file not found")
        data = p.read_bytes()
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            text = "\0"
        if "\0" in text or any(not line.isprintable() for line in text.splitlines()):
            raise UsageError(f"{p}: not a labels file (expected UTF-8 text, one class name per line)")
        return data
    return ("\n".join(str(x) for x in labels) + "\n").encode()


def add_onnx_model(
    repo: str | Path,
    name: str,
    onnx_path: str | Path,
    *,
    backend: str = "onnxruntime",
    options: ModelOptions | None = None,
    labels: Sequence[str] | str | Path | None = None,
    version: int | None = None,
    force: bool = False,
    template_dir: str | Path | None = None,
) -> tuple[WriteResult, ModelConfig]:
    """An ONNX model for a backend that runs ONNX files (:func:`trtrepo.contracts.backends.options`
    ``("onnx")``: the ONNX Runtime backend, the Python backend running ONNX Runtime, ...)."""
    spec = backends.for_option(backend)
    if spec is None or spec.source != "onnx":
        raise OptionError("backend", f"{backend!r}: an ONNX model deploys to {' or '.join(map(repr, backends.options('onnx')))}")
    onnx_path = Path(onnx_path)
    io = ModelIO.from_onnx(onnx_path)
    options = options or ModelOptions()
    if labels is not None:
        options = replace(options, has_labels=True)
    config = config_from_io(name, io, spec, options)
    files: dict[str, FileSource] = {"model.onnx": onnx_path}
    files.update(external_data_files(onnx_path))
    for dst, src in spec.extra_files:
        files[dst] = template_file(src, template_dir, spec.template_dir)
    model_files: dict[str, FileSource] = {options.label_filename: labels_bytes(labels)} if labels is not None else {}
    if spec.runs_python:
        model_files.update(execution_env_files(options))
    result = add_model(repo, config, files, model_files=model_files, version=version, force=force, io=io,
                       template_dir=template_dir)
    return result, config


def external_data_files(onnx_path: Path) -> dict[str, FileSource]:
    """The external data files an ONNX model names (every model over 2 GB has them), keyed by
    their location relative to the model, which they keep beside ``model.onnx``; each must pass
    :func:`~trtrepo.modelio.external_data_path` (the check ``export`` and ``deploy`` make: inside
    the model's folder, no symbolic or hard link) and hold the bytes the model reads from it."""
    import onnx

    model = load_onnx(onnx_path, load_weights=False)
    need: dict[str, int] = {}
    tensors = [*model.graph.initializer, *(t for n in model.graph.node for a in n.attribute
                                            if a.type == onnx.AttributeProto.TENSOR for t in (a.t,))]
    for t in tensors:
        if not onnx.external_data_helper.uses_external_data(t):
            continue
        info = {e.key: e.value for e in t.external_data}
        rel = info.get("location", "")
        try:
            check_relpath(rel, f"{onnx_path}: tensor '{t.name}' external data location")
        except UsageError as exc:
            raise UsageError(exc.message) from None
        end = int(info.get("offset", 0) or 0) + int(info.get("length", 0) or 0)
        need[rel] = max(need.get(rel, 0), end)
    files: dict[str, FileSource] = {}
    for rel, end in need.items():
        src = external_data_path(onnx_path.parent, rel, f"{onnx_path}: its")
        if src.stat().st_size < end:
            raise UsageError(f"{src}: {src.stat().st_size} bytes, but {onnx_path.name} reads up to byte {end} of it")
        files[rel] = src
    return files


def add_plan_model(
    repo: str | Path,
    name: str,
    plan: str | Path,
    *,
    io: ModelIO | None = None,
    options: ModelOptions | None = None,
    labels: Sequence[str] | str | Path | None = None,
    target: PlanTarget = PlanTarget(),
    version: int | None = None,
    force: bool = False,
    template_dir: str | Path | None = None,
) -> tuple[WriteResult, ModelConfig]:
    """A TensorRT plan; its IO (unless given) and optimization profiles come from ``model.plan.json``;
    warnings when it was built for another TensorRT version or GPU than ``target``."""
    plan = Path(plan)
    if not plan.is_file():
        raise UsageError(f"{plan}: plan file not found")
    meta = read_plan_metadata(plan, missing_ok=True)
    if io is None:
        if meta is None:
            raise OptionError("", f"{plan}: no IO description: give the ONNX model ({{onnx_for_io}}) or keep "
                                  f"{plan_metadata_path(plan).name} beside it", others={"onnx_for_io": "io="})
        io = meta.io
    options = options or ModelOptions()
    if labels is not None:
        options = replace(options, has_labels=True)
    config = config_from_io(name, io, backends.TENSORRT, options, plan=meta)
    files: dict[str, FileSource] = {"model.plan": plan}
    for _, fname in config.cc_model_filenames:
        files.setdefault(fname, plan.parent / fname)
    if meta is not None:
        files[plan_metadata_path("model.plan").name] = meta.portable().to_json().encode()
    warnings = check_plan_target(meta, tensorrt_version=target.tensorrt, compute_capability=target.compute_capability)
    model_files = {options.label_filename: labels_bytes(labels)} if labels is not None else {}
    result = add_model(repo, config, files, model_files=model_files, version=version, force=force, io=io,
                       plan=meta, template_dir=template_dir, warnings=warnings)
    return result, config


def preprocess_package_files() -> dict[str, FileSource]:
    """trtrepo's own preprocessing code, copied into the preprocessing model's version folder so
    the server runs exactly ``Preprocess.apply`` (data.py plus the modules it imports)."""
    pkg = Path(__file__).parent.parent  # the trtrepo package
    files: dict[str, FileSource] = {"trtrepo_preprocess/__init__.py": b'"""Copy of trtrepo preprocessing (written by trtrepo)."""\n'}
    for rel in _module_closure(pkg, "data.py"):
        files[f"trtrepo_preprocess/{rel}"] = pkg / rel
    return files


def postprocess_package_files() -> dict[str, FileSource]:
    """trtrepo's own ``trtrepo.detect`` (numpy only), copied into the detector postprocessing
    model's version folder as ``trtrepo_postprocess/detect/`` so the server runs exactly
    ``trtrepo.detect.postprocess`` and ``unletterbox``."""
    pkg = Path(__file__).parent.parent  # the trtrepo package
    files: dict[str, FileSource] = {"trtrepo_postprocess/__init__.py": b'"""Copy of trtrepo.detect (written by trtrepo)."""\n'}
    for rel in _module_closure(pkg, "detect/__init__.py"):
        files[f"trtrepo_postprocess/{rel}"] = pkg / rel
    return files


def _module_closure(pkg: Path, start: str) -> list[str]:
    """``start`` and every module of the package it imports at module level, transitively (relative
    imports; a subpackage brings its ``__init__.py``), as paths relative to ``pkg``: what a copy of
    ``start`` needs to import on its own. Function-level imports are not followed (they load
    optional parts the preprocessing never calls)."""
    todo, seen = [start], set()
    while todo:
        rel = todo.pop()
        if rel in seen:
            continue
        seen.add(rel)
        here = Path(rel).parent
        for node in ast.parse((pkg / rel).read_text()).body:
            if not isinstance(node, ast.ImportFrom) or node.level == 0:
                continue
            base = here
            for _ in range(node.level - 1):
                base = base.parent
            names = [node.module] if node.module else [a.name for a in node.names]
            for name in names:
                target = base.joinpath(*name.split("."))
                if (pkg / target / "__init__.py").is_file():
                    parts = target.parts
                    todo += [str(Path(*parts[:i], "__init__.py")) for i in range(1, len(parts) + 1)]
                    todo += [str(target / f"{a.name}.py") for a in node.names if (pkg / target / f"{a.name}.py").is_file()]
                elif (pkg / f"{target}.py").is_file():
                    todo.append(f"{target}.py")
                    todo += [str(Path(*target.parts[:i], "__init__.py")) for i in range(1, len(target.parts))]
    return sorted(seen)


def add_image_ensemble(
    repo: str | Path,
    model: ModelConfig,
    preprocess: Any,
    *,
    name: str | None = None,
    image_input: str = "IMAGE",
    options: ModelOptions | None = None,
    version: int | None = None,
    force: bool = False,
    template_dir: str | Path | None = None,
) -> tuple[WriteResult, WriteResult]:
    """``<model>_preprocess`` (Python: image bytes -> input tensor) and ``<model>_ensemble``."""
    name = name or f"{model.name}_ensemble"
    pre_name = f"{model.name}_preprocess"
    if len(model.inputs) != 1:
        raise UsageError(f"ensemble '{name}': model '{model.name}' has {len(model.inputs)} inputs; an image ensemble needs one")
    tensor = model.inputs[0]
    dtype = {"TYPE_FP32": "float32", "TYPE_FP16": "float16", "TYPE_UINT8": "uint8", "TYPE_INT8": "int8"}.get(tensor.data_type)
    if dtype is None or dtype != preprocess.dtype:
        raise UsageError(f"ensemble '{name}': preprocessing produces {preprocess.dtype} but input '{tensor.name}' is {tensor.data_type}")
    spec = TensorSpec(tensor.name, dtype, ((-1,) if model.max_batch_size > 0 else ()) + tuple(tensor.dims),
                      0 if model.max_batch_size > 0 else None)
    pre_cfg = preprocess_config(pre_name, image_input, spec, model.max_batch_size, options)
    ens_cfg = ensemble_config(name, image_input, pre_cfg, model)
    pre_spec = json.dumps(preprocess.to_dict(), indent=2).encode() + b"\n"
    files: dict[str, FileSource] = {"model.py": template_file("preprocess_model.py", template_dir), "preprocess.json": pre_spec}
    files.update(preprocess_package_files())
    # Render and validate the ensemble before writing anything (its steps must resolve).
    ens_text = render_config(ens_cfg, template_dir)
    known = known_models(Path(repo), {pre_name: parse_config_text(render_config(pre_cfg, template_dir), pre_name)})
    validate_config_text(ens_text, f"{name}/config.pbtxt", model_dir_name=name, known_models=known)
    pre = add_model(repo, pre_cfg, files, model_files=execution_env_files(options or ModelOptions()), version=version,
                    force=force, template_dir=template_dir)
    ens = add_model(repo, ens_cfg, {}, version=version, force=force, template_dir=template_dir)
    return pre, ens


def _detector_output(name: str, model: ModelConfig, layout: YoloLayout) -> TensorConfig:
    """The model output ``layout`` describes, as one request of one image carries it (``[1, C,
    A]``): the one output of three dimensions, batch 1 or dynamic, whose channel axis fits."""
    fits = []
    for o in model.outputs:
        full = ((-1,) if model.max_batch_size > 0 else ()) + tuple(o.dims)
        if len(full) == 3 and full[0] in (-1, 1) and full[layout.channel_axis] in (-1, layout.channels):
            fits.append(TensorConfig(o.name, o.data_type, (1, *full[1:])))
    if len(fits) != 1:
        shapes = ", ".join(f"'{o.name}' {list(o.dims)}" for o in model.outputs)
        what = "several outputs fit" if fits else "no output fits"
        raise UsageError(f"ensemble '{name}': {what} the {layout.kind.replace('_', '-')} layout with {layout.channels} "
                         f"channels on axis {layout.channel_axis} (model '{model.name}': {shapes})")
    return fits[0]


def _letterbox_input(name: str, model: ModelConfig, preprocess: Any) -> TensorSpec:
    """The model's input as the preprocessing model writes it for one image (``[1, C, H, W]``),
    checked against the letterbox size, channels, layout and dtype of ``preprocess``."""
    if len(model.inputs) != 1:
        raise UsageError(f"ensemble '{name}': model '{model.name}' has {len(model.inputs)} inputs; a detector ensemble needs one")
    if preprocess.letterbox is None:
        raise UsageError(f"ensemble '{name}': the preprocessing does not letterbox; a detector ensemble maps the boxes back "
                         f"through the letterbox geometry (preprocess option 'letterbox')")
    tensor = model.inputs[0]
    dtype = {"TYPE_FP32": "float32", "TYPE_FP16": "float16", "TYPE_UINT8": "uint8", "TYPE_INT8": "int8"}.get(tensor.data_type)
    if dtype is None or dtype != preprocess.dtype:
        raise UsageError(f"ensemble '{name}': preprocessing produces {preprocess.dtype} but input '{tensor.name}' is {tensor.data_type}")
    full = ((-1,) if model.max_batch_size > 0 else ()) + tuple(tensor.dims)
    h, w = preprocess.letterbox
    sample = (preprocess.channels, h, w) if preprocess.layout == "NCHW" else (h, w, preprocess.channels)
    if len(full) != 4 or full[0] not in (-1, 1) or any(d not in (-1, s) for d, s in zip(full[1:], sample, strict=True)):
        raise UsageError(f"ensemble '{name}': the preprocessing makes one image {list(sample)} ({preprocess.layout}, "
                         f"letterbox {h}x{w}) but input '{tensor.name}' takes {list(full)}")
    return TensorSpec(tensor.name, dtype, (1, *sample), None)


def add_detector_ensemble(
    repo: str | Path,
    model: ModelConfig,
    preprocess: Any,
    layout: YoloLayout,
    nms: NmsSettings | None = None,
    *,
    options: ModelOptions | None = None,
    version: int | None = None,
    force: bool = False,
    template_dir: str | Path | None = None,
) -> tuple[WriteResult, WriteResult, WriteResult]:
    """A detector served on encoded images: ``<model>_preprocess`` (Python: image bytes -> the
    letterboxed input tensor, plus the letterbox geometry), ``<model>_postprocess`` (Python:
    :func:`trtrepo.detect.postprocess` at ``nms`` and :func:`~trtrepo.detect.unletterbox` of the
    raw output ``layout`` describes -> ``boxes`` / ``scores`` / ``classes`` in the original
    image's pixels) and ``<model>_ensemble`` chaining the three; ``model`` (already in ``repo``)
    stays as it is.

    One image per request: the preprocessing, postprocessing and ensemble have ``max_batch_size``
    0 (the box count differs per image), while the detector keeps its own batching, so that
    concurrent requests still share its batches. ``preprocess`` must letterbox to the model's
    input size. Every config is rendered and checked before anything is written, and the
    ensemble is written last: each intermediate repository serves."""
    name = f"{model.name}_ensemble"
    pre_name, post_name = f"{model.name}_preprocess", f"{model.name}_postprocess"
    image_input = "IMAGE"
    opts = options or ModelOptions()
    pre_cfg = preprocess_config(pre_name, image_input, _letterbox_input(name, model, preprocess), 0, opts, geometry=True)
    post_cfg = postprocess_config(post_name, _detector_output(name, model, layout), layout, nms, opts)
    ens_cfg = detector_ensemble_config(name, image_input, pre_cfg, model, post_cfg)
    pre_files: dict[str, FileSource] = {"model.py": template_file("preprocess_model.py", template_dir),
                                        "preprocess.json": json.dumps(preprocess.to_dict(), indent=2).encode() + b"\n"}
    pre_files.update(preprocess_package_files())
    post_files: dict[str, FileSource] = {"model.py": template_file("postprocess_model.py", template_dir)}
    post_files.update(postprocess_package_files())
    # Render and validate all three before writing anything (the ensemble's steps must resolve).
    texts = {c.name: render_config(c, template_dir) for c in (pre_cfg, post_cfg)}
    for step, text in texts.items():
        validate_config_text(text, f"{step}/config.pbtxt", model_dir_name=step)
    known = known_models(Path(repo), {step: parse_config_text(text, step) for step, text in texts.items()})
    validate_config_text(render_config(ens_cfg, template_dir), f"{name}/config.pbtxt", model_dir_name=name, known_models=known)
    env_files = execution_env_files(opts)
    pre = add_model(repo, pre_cfg, pre_files, model_files=env_files, version=version, force=force, template_dir=template_dir)
    post = add_model(repo, post_cfg, post_files, model_files=env_files, version=version, force=force, template_dir=template_dir)
    ens = add_model(repo, ens_cfg, {}, version=version, force=force, template_dir=template_dir)
    return pre, post, ens
