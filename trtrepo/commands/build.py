"""``trtrepo build``."""

from __future__ import annotations

import shlex

import click

from ..contracts import profile as P
from ..contracts.profile import BatchProfile
from ..errors import UsageError
from ._inputs import io_paths
from ._options import data_options
from ._types import SHAPE


@click.command("build")
@click.argument("model", type=click.Path(dir_okay=False))
@click.option("-o", "--output", type=click.Path(dir_okay=False), default=None,
              help="The plan to write, e.g. model_repository/NAME/1/model.plan (metadata goes to model.plan.json).")
@click.option("--min-batch", type=click.IntRange(min=1), default=P.DEFAULT_MIN_BATCH, show_default=True)
@click.option("--opt-batch", type=click.IntRange(min=1), default=P.DEFAULT_OPT_BATCH, show_default=True)
@click.option("--max-batch", type=click.IntRange(min=1), default=P.DEFAULT_MAX_BATCH, show_default=True)
@click.option("--shape", "shapes", type=SHAPE, multiple=True,
              help="Range of an input with other dynamic axes, trtexec-style dims: input_ids:1x8,8x64,32x128 (repeatable).")
@click.option("--workspace", default=None, metavar="SIZE", help="Workspace memory pool limit, e.g. 4GiB (default: TensorRT's).")
@click.option("--opt-level", type=click.IntRange(0, 5), default=3, show_default=True, help="Builder optimization level.")
@click.option("--timing-cache", type=click.Path(dir_okay=False), default=None,
              help="Timing cache file: loaded when it exists, saved after the build.")
@click.option("--legacy-calibrator", type=click.Choice(["entropy", "minmax"]), default=None,
              help="TensorRT 8.6-10.x only: implicit INT8 from the FP32 model with this calibrator (deprecated route).")
@click.option("--cache", "calib_cache", type=click.Path(dir_okay=False), default=None,
              help="Calibration cache for --legacy-calibrator: read when present (no --data needed), written after calibrating.")
@data_options(required=False, batch_size=8)
@click.option("--allow-fp32", is_flag=True, help="Build a model without Q/DQ nodes as an FP32 (strongly typed) engine.")
@click.option("--fp16", is_flag=True,
              help="Mixed INT8+FP16: quantized layers stay INT8, the rest runs in FP16, network IO stays FP32. Q/DQ route: "
                   "the unquantized graph is converted to FP16 before the strongly typed build (TensorRT 10 and 11); "
                   "--legacy-calibrator: BuilderFlag.FP16 (TensorRT 10).")
@click.option("--keep-fp32", "keep_fp32", multiple=True, metavar="OP",
              help="With --fp16 (Q/DQ route): ONNX op type kept in FP32, e.g. LayerNormalization (repeatable).")
@click.option("--fp16-onnx", type=click.Path(dir_okay=False), default=None,
              help="With --fp16 (Q/DQ route): keep the FP16-converted ONNX model here (what the trtexec line builds; "
                   "evaluate it on the CPU with 'trtrepo evaluate').")
@click.option("--print-trtexec", is_flag=True, help="Print the equivalent trtexec command and exit (needs no TensorRT).")
@click.option("--for-tensorrt", "for_major", type=click.IntRange(8, 99), default=None, metavar="MAJOR",
              help="With --print-trtexec: the TensorRT major version to print for (default: the installed one, else 10 and 11).")
@click.option("--force/--no-force", default=True, show_default=True, help="Overwrite an existing plan.")
@io_paths({"model": "MODEL", "calib_cache": "--cache", "data_spec": "--data", "preprocess": "--preprocess", "labels": "--labels"},
          {"output": "-o", "fp16_onnx": "--fp16-onnx"})
def command(model: str, output: str | None, min_batch: int, opt_batch: int, max_batch: int, shapes: tuple[str, ...],
            workspace: str | None, opt_level: int, timing_cache: str | None, legacy_calibrator: str | None,
            calib_cache: str | None, data_spec: str | None, preprocess: str | None, labels: str | None, limit: int | None,
            seed: int, batch_size: int, skip_non_images: bool, allow_fp32: bool, fp16: bool, keep_fp32: tuple[str, ...], fp16_onnx: str | None,
            print_trtexec: bool, for_major: int | None, force: bool) -> None:
    """Build a TensorRT engine (model.plan) from MODEL.

    MODEL is the Q/DQ ONNX model from 'trtrepo quantize' (strongly typed build: TensorRT 10 and 11), or
    with --legacy-calibrator the FP32 ONNX model (implicit INT8, TensorRT 8.6-10.x). One optimization
    profile spans --min/--opt/--max-batch (other dynamic axes: --shape). --fp16 builds mixed INT8+FP16.
    Needs TensorRT, cuda-python and an NVIDIA GPU, except with --print-trtexec.
    """
    from ..data import DataOptions  # noqa: PLC0415  # deferred: --help imports every command module; the stage loads only when the command runs
    from ..engine import BuildOptions, build_engine, parse_size, trtexec_equivalents  # noqa: PLC0415  # deferred: --help imports every command module; the stage loads only when the command runs

    if output is None and not print_trtexec:
        raise UsageError("-o/--output is required (e.g. model_repository/NAME/1/model.plan)")
    ctx = click.get_current_context()
    if ctx.get_parameter_source("batch_size") == click.core.ParameterSource.COMMANDLINE and batch_size != opt_batch:
        raise UsageError(f"--batch-size {batch_size}: TensorRT calibrates with the profile's opt shape, so calibration "
                         f"batches have --opt-batch ({opt_batch}) samples; set --opt-batch instead")
    data = None
    if data_spec is not None:
        data = DataOptions(spec=data_spec, preprocess=preprocess, labels=labels, limit=limit, seed=seed, batch_size=batch_size,
                           skip_non_images=skip_non_images)
    options = BuildOptions(
        profile=BatchProfile.for_build(min_batch, opt_batch, max_batch, shapes),
        workspace=parse_size(workspace) if workspace else None,
        opt_level=opt_level, timing_cache=timing_cache, legacy_calibrator=legacy_calibrator,
        calib_cache=calib_cache, data=data, allow_fp32=allow_fp32,
        fp16=fp16, keep_fp32_ops=tuple(op for item in keep_fp32 for op in item.split(",") if op), fp16_onnx=fp16_onnx,
    )
    if print_trtexec:
        commands, notes = trtexec_equivalents(model, options, output, for_major)
        for note in notes:
            click.echo(f"# {note}")
        for major, argv in commands:
            if len(commands) > 1:
                click.echo(f"# TensorRT {major}.x")
            click.echo(shlex.join(argv))
        return
    result = build_engine(model, str(output), options, force=force)
    meta = result.metadata
    gpu = f"{meta.gpu.name} (compute capability {meta.gpu.compute_capability})" if meta.gpu else "unknown GPU"
    click.echo(f"built {result.plan} with TensorRT {meta.tensorrt_version} on {gpu}")
    click.echo(f"  route: {meta.precision_route} ({meta.precision.get('mode', 'int8')}), calibration: {meta.calibration_method}")
    fp16_info = meta.precision.get("fp16") or {}
    if fp16_info.get("saved_to"):
        click.echo(f"  FP16-converted ONNX: {fp16_info['saved_to']}")
    for t in meta.io_tensors:
        rng = meta.profile.get(t.name)
        extra = f"  profile {rng.describe()}" if rng else ""
        click.echo(f"  {t.mode.lower():<6} {t.name}: {t.dtype} {list(t.shape)}{extra}")
    click.echo(f"  metadata: {result.metadata_path}")
    if result.timing_cache:
        click.echo(f"  timing cache: {result.timing_cache}")
    click.echo(f"  trtexec equivalent: {meta.trtexec}")
