"""Option decorators shared by several commands."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import fields
from typing import Any, TypeVar

import click

from .. import rangemath as H
from ..qdq import DETECTOR_TASKS, QDQ_TARGETS, QuantizeOptions, qdq_target, target_names
from ..weightmath import ROUNDING_STEPS
from ._types import ACCURACY_TARGET, RANGES, SMOOTH_QUANT

F = TypeVar("F", bound=Callable[..., Any])


def not_empty(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """A data spec given as ``''`` is refused (a path of ``''`` would read as the working folder)."""
    if value is not None and not value.strip():
        raise click.BadParameter("an empty value (expected a folder, .npy, .npz, 'module:callable' or demo:SPLIT)")
    return value


def data_options(required: bool = True, batch_size: int = 32) -> Callable[[F], F]:
    """``--data --preprocess --labels --limit --seed --batch-size --skip-non-images``."""

    def deco(f: F) -> F:
        opts = [
            click.option("--data", "data_spec", required=required, metavar="SPEC", callback=not_empty,
                         help="Data: demo:calib|demo:val, an image folder, .npy/.npz, or package.module:callable."),
            click.option("--preprocess", "preprocess", type=click.Path(dir_okay=False), default=None,
                         help="Preprocessing spec (JSON/YAML, see 'trtrepo preprocess'); required for image folders."),
            click.option("--labels", type=click.Path(), default=None,
                         help="Integer labels (.npy or text, one per sample); for a detector's image folder, boxes: a "
                              "COCO JSON file or a folder of YOLO txt files."),
            click.option("--limit", type=click.IntRange(min=1), default=None, help="Use N samples (a deterministic subset)."),
            click.option("--seed", type=click.IntRange(min=0), default=0, show_default=True, help="Seed of the --limit subset."),
            click.option("--batch-size", type=click.IntRange(min=1), default=batch_size, show_default=True),
            click.option("--skip-non-images", is_flag=True,
                         help="Skip files of an image folder that are not images (by extension, or a header that "
                              "does not read as an image; named in a warning); without it such a file is an error."),
        ]
        for o in reversed(opts):
            f = o(f)
        return f

    return deco


s3_endpoint_option = click.option(
    "--s3-endpoint", default=None, metavar="URL",
    help="http(s)://HOST:PORT of an S3-compatible service for an s3:// repository (default: AWS, or "
         "$AWS_ENDPOINT_URL_S3 / $AWS_ENDPOINT_URL). Credentials: boto3's chain (AWS_ACCESS_KEY_ID, ...).")


def quantize_options(f: F) -> F:
    """The INT8 request of ``quantize`` and ``deploy``, declared once: adds the options below and
    calls the command with ``int8=`` a :class:`~trtrepo.quantize.QuantizeSettings` built from
    them by name (an option named like a ``QuantizeSettings`` field sets it; one named like a
    :class:`~trtrepo.qdq.QuantizeOptions` field sets ``placement``). A new INT8 knob is a
    field there and an option here. ``--target auto`` is the backend's target in ``deploy`` and
    TensorRT's in ``quantize``. Apply directly above ``def`` (below ``@io_paths``, which sees the
    file options as given)."""
    opts = [
        click.option("--method", type=click.Choice(H.method_names(auto=True)), default=None,
                     help="Range calibrator [default: auto: quantizes with every registered method and keeps the best on "
                          "held-out data]."),
        click.option("--smooth-quant", "smooth_quant", type=SMOOTH_QUANT, default="auto", show_default=True,
                     help="SmoothQuant on MatMul/Gemm inputs: migrate activation outliers into the weights with ALPHA in "
                          "(0, 1]; auto compares 0.5/0.65/0.8/0.95 and none on held-out data. A smoothed input's range is "
                          "the exact min/max of the smoothed statistics whatever --method says."),
        click.option("--weight-rounding", type=click.Choice(("auto",) + ROUNDING_STEPS), default="auto", show_default=True,
                     help="How Conv/Gemm weights are rounded to INT8: auto measures bias correction and AdaRound against "
                          "nearest rounding on the held-out data and keeps the best; nearest is the fastest."),
        click.option("--equalize/--no-equalize", default=True, show_default=True,
                     help="Activation equalization of Conv -> ReLU/ReLU6 -> depthwise Conv chains before calibration "
                          "(kept only when the FP32 outputs stay within 1e-4 of their range)."),
        click.option("--target", type=click.Choice(("auto", *target_names())), default="auto", show_default=True,
                     help="Q/DQ placement: " + "; ".join(f"{t.name}: {t.help}" for t in QDQ_TARGETS.values())
                          + "; auto: the backend's in deploy (tensorrt for a plan, onnxruntime for the ONNX Runtime and "
                            "Python backends), tensorrt in quantize."),
        click.option("--exclude-op", "exclude_ops", multiple=True, metavar="OP",
                     help="Leave every node of this op type in float (repeatable)."),
        click.option("--exclude-node", "exclude_nodes", multiple=True, metavar="PATTERN",
                     help="Leave nodes whose name matches (exact or full-match regex) in float (repeatable)."),
        click.option("--quantize-attention", is_flag=True,
                     help="Also quantize the attention MatMuls of two activations (Q.K^T, P.V), left in float by default "
                          "as TensorRT/ModelOpt do; the additive-mask path stays float regardless."),
        click.option("--quantize-detector-head", is_flag=True,
                     help="Also quantize a detector's decode head (box distribution, anchor arithmetic, sigmoid scores, "
                          "the box/score concat), found in the graph and left in float by default: one INT8 scale over "
                          "box pixels and class probabilities erases the scores."),
        click.option("--reduce-range", is_flag=True,
                     help="onnxruntime target: 7-bit weights, so that the model stays exact on x86 CPUs without VNNI in "
                          "runtimes that do not set session.x64quantprecision (e.g. Triton's onnxruntime backend)."),
        click.option("--ranges", "ranges", type=RANGES, default=None,
                     help="Ranges JSON from 'trtrepo calibrate --ranges' (amax, and min/max for the onnxruntime target): "
                          "quantize with it, no calibration (--data then only serves the check against FP32)."),
        click.option("--cache", "cache", type=click.Path(dir_okay=False), default=None,
                     help="TensorRT calibration cache from 'trtrepo calibrate --cache', used like --ranges; refused when "
                          "made for another model."),
        click.option("--accuracy-target", type=ACCURACY_TARGET, default=None,
                     help="top1-drop=POINTS, top1=PERCENT, cosine=MIN, map=MIN (a detector's mAP50-95 vs FP32) or "
                          "map-drop=POINTS (vs box labels): leave the fewest, most sensitive layers in float that meet it."),
        click.option("--accept-accuracy-loss", is_flag=True,
                     help="Ship the INT8 model even when the held-out check against FP32 fails or cannot decide (label "
                          "accuracy drop <= 1 point with labels; else the expected top-1 drop under FP32's softmax, the "
                          "upper end of its 95 % interval < 1 point; a detector: mAP50-95 drop vs box labels <= 1 point, "
                          "else mAP50-95 vs FP32's boxes >= 0.9, at the interval's end; cosine >= 0.99 for "
                          "embeddings). Without it quantize "
                          "writes nothing and exits 1, deploy ships FP32."),
        click.option("--eval-data", default=None, metavar="SPEC", callback=not_empty,
                     help="Held-out evaluation data for the INT8 choices and the check against FP32, opened like --data "
                          "(an image folder through --preprocess, or an Ultralytics export's own letterbox; default: a "
                          "--holdout part of --data that calibration does not use). A few hundred samples give a settled "
                          "verdict."),
        click.option("--holdout", type=click.FloatRange(0, 1, min_open=True, max_open=True), default=0.2,
                     show_default=True, help="Fraction of --data held out when --eval-data is not given."),
        click.option("--metric-output", default=None, metavar="OUTPUT",
                     help="Output the INT8 choices and the check are measured on (default: the first; e.g. an embedding "
                          "output with --accuracy-target cosine=0.99)."),
        click.option("--task", type=click.Choice(DETECTOR_TASKS), default="auto", show_default=True,
                     help="detect: the model is a YOLO-style detector although neither its graph (the decode head) nor "
                          "its exporter's metadata (Ultralytics' task) says so: its outputs laid out [batch, 4 + "
                          "classes, anchors] or [batch, anchors, 5 + classes] are judged in boxes (decode + NMS, "
                          "mAP50-95 vs FP32); refused when no output has that layout."),
    ]
    names = [o(lambda: None).__click_params__[0].name for o in opts]  # type: ignore[attr-defined]

    @functools.wraps(f)
    def composed(*args: Any, **kw: Any) -> Any:
        return f(*args, int8=build_settings({n: kw.pop(n) for n in names}), **kw)

    for o in reversed(opts):
        composed = o(composed)
    return composed  # type: ignore[return-value]


def build_settings(values: dict[str, Any]) -> Any:
    """:class:`~trtrepo.quantize.QuantizeSettings` from the option group's values, by name; the
    ``--target`` name becomes its record here (the CLI edge), ``auto`` the backend's."""
    from ..quantize import QuantizeSettings  # noqa: PLC0415  # deferred: --help imports every command module; the stage loads only when the command runs

    target = values.pop("target")
    placement_fields = {f.name for f in fields(QuantizeOptions)}
    placement = {k: values.pop(k) for k in list(values) if k in placement_fields}
    if target != "auto":
        placement["target"] = qdq_target(target)
    return QuantizeSettings(placement=QuantizeOptions(**placement), target_from_backend=target == "auto", **values)


DATA_FIELDS = ("data_spec", "preprocess", "labels", "limit", "seed", "batch_size", "skip_non_images")


def composed_data(f: F) -> F:
    """Calls the command with ``data=`` one :class:`~trtrepo.data.DataOptions` made of the
    :func:`data_options` values (``spec`` ``""`` when ``--data`` was not given: ``--data ''`` is
    refused, so the empty spec only means "none"). Apply directly above ``def`` (below
    ``@io_paths``, which checks the files as given)."""

    @functools.wraps(f)
    def composed(*args: Any, **kw: Any) -> Any:
        from ..data import DataOptions  # noqa: PLC0415  # deferred: --help imports every command module; the stage loads only when the command runs

        v = {n: kw.pop(n) for n in DATA_FIELDS}
        spec = v.pop("data_spec") or ""
        return f(*args, data=DataOptions(spec=spec, **v), **kw)

    return composed  # type: ignore[return-value]
