"""``trtrepo deploy``."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from ..contracts import backends, builtin
from ..contracts.location import is_remote
from ..errors import UsageError
from ._inputs import io_paths
from ._model_options import build_model_options, model_config_options
from ._options import composed_data, data_options, quantize_options, s3_endpoint_option
from ._output import json_option, summary_output
from ._types import SHAPE

if TYPE_CHECKING:
    from ..data import DataOptions
    from ..quantize import QuantizeSettings


@click.command("deploy")
@click.argument("source", default="demo")
@click.option("--repo", default="model_repository", show_default=True, type=click.Path(file_okay=False),
              help="The repository folder, or s3://BUCKET/PREFIX (written by an upload protocol under which a "
                   "server never loads a partial version; see 'Serving from a fleet' in docs/fleet.md).")
@s3_endpoint_option
@click.option("--name", default=None, help="Model name (default: from SOURCE; 'demo' for the demo).")
@click.option("--backend", type=click.Choice(("auto", *backends.options())), default="auto", show_default=True,
              help="auto: tensorrt with TensorRT and a GPU; else onnxruntime (python when the local tritonserver has no onnxruntime backend).")
@click.option("--python-backend", "python_variant", is_flag=True,
              help="Also write NAME_python: the Python-backend model running the same ONNX with ONNX Runtime.")
@click.option("--ensemble", is_flag=True, help="Also write NAME_preprocess + NAME_ensemble (encoded image bytes in).")
@click.option("--precision", type=click.Choice(["auto", "int8", "fp32"]), default="auto", show_default=True,
              help="auto: INT8 when the quantization stage and calibration data are available, else FP32.")
@click.option("--weights", type=click.Path(dir_okay=False), default=None, help="Weights for an entry point / torchvision source.")
@click.option("--class-labels", type=click.Path(dir_okay=False, exists=True), default=None,
              help="Class names file for the output's label_filename (the demo's are 0-9).")
@click.option("--workdir", type=click.Path(file_okay=False), default=None, help="Keep intermediate files (ONNX, Q/DQ, plan) here.")
@click.option("--shape", "shapes", type=SHAPE, multiple=True,
              help="TensorRT profile of an input with dynamic axes (trtexec-like dims, e.g. input_ids:1x8,8x16,32x32; "
                   "repeatable). Default: from the calibration data's smallest, median and largest sizes.")
@click.option("--output-names", default=None, metavar="A,B",
              help="Names of a PyTorch source's outputs, in the order forward() returns them (default: output, or "
                   "output0, output1, ...); give validate the same.")
@click.option("--input-shape", "input_shapes", multiple=True, metavar="[NAME:]DIMS",
              help="Input shape of a PyTorch source without the batch axis, e.g. 3x224x224 or pixels:3x224x224 "
                   "(repeat per input). Default: read off the --data samples.")
@click.option("--tune", "tune_after", is_flag=True,
              help="Then search the model's serving config on a local tritonserver and write the best one "
                   "('trtrepo tune --apply' with --data, concurrency 8; the report in REPO/../tune-NAME).")
@click.option("--tune-budget-s", type=click.FloatRange(min=0, min_open=True), default=300.0, show_default=True,
              help="Seconds the --tune search may take.")
@data_options(required=False)
@model_config_options
@json_option
@io_paths({"source": "SOURCE", "weights": "--weights", "data_spec": "--data", "preprocess": "--preprocess", "labels": "--labels", "class_labels": "--class-labels", "cache": "--cache", "ranges": "--ranges", "eval_data": "--eval-data"},
          {"repo": "--repo", "workdir": "--workdir"})
@quantize_options
@composed_data
def command(as_json: bool, source: str, repo: str, name: str | None, backend: str, python_variant: bool, ensemble: bool, precision: str,
            weights: str | None, class_labels: str | None, workdir: str | None, shapes: tuple[Any, ...],
            output_names: str | None, input_shapes: tuple[str, ...], tune_after: bool, tune_budget_s: float,
            s3_endpoint: str | None, data: DataOptions, int8: QuantizeSettings, **kw: Any) -> None:
    """Export SOURCE (default: the embedded demo), quantize to INT8, build (with TensorRT) and write a
    Triton model repository (default model_repository/), then print a summary table.

    Without TensorRT or a GPU the ONNX model is deployed for the ONNX Runtime backend (or the
    Python backend) instead.
    """
    from ..deploy import DeployOptions, deploy  # noqa: PLC0415  # deferred: --help imports every command module; the stage loads only when the command runs

    if tune_after and is_remote(repo):
        raise UsageError(f"--tune: tunes a local repository on the local server; not with --repo {repo} (tune a local "
                         f"deploy, then deploy it to object storage)")
    model = build_model_options(kw)
    opts = DeployOptions(
        source=source, repo=repo, name=name, backend=backend, python_variant=python_variant, ensemble=ensemble,
        precision=precision, data=data, int8=int8, class_labels=class_labels, model=model, version=kw.pop("version"),
        force=kw.pop("force"), template_dir=kw.pop("template_dir"), workdir=workdir, weights=weights,
        shapes=tuple(shapes), input_shapes=tuple(input_shapes),
        output_names=tuple(n.strip() for n in output_names.split(",")) if output_names else (), s3_endpoint=s3_endpoint,
    )
    with summary_output(as_json) as emit:
        report = deploy(opts)
        for line in report.summary_lines():
            click.echo(line)
        for w in report.warnings:
            click.echo(f"warning: {w}", err=True)
        tuned = _tune(report, source, repo, data.spec or None, data.preprocess, tune_budget_s) if tune_after else None
        click.echo(f"serve it with: trtrepo serve {repo}" + (f" --s3-endpoint {s3_endpoint}" if s3_endpoint else ""))

        emit({"command": "deploy", "source": source, "repo": str(repo),
              "precision": report.models[0].precision if report.models else None,
              "steps": [asdict(s) for s in report.steps], "models": [asdict(m) for m in report.models],
              "accuracy": None if report.accuracy is None else report.accuracy.to_dict(),
              "front": None if report.front is None else report.front.to_dict(),
              "notes": list(report.notes), "warnings": report.warnings_json(),
              "tune": None if tuned is None else tuned.to_dict()})


def _tune(report: Any, source: str, repo: str, data_spec: str | None, preprocess: Any, budget_s: float) -> Any:
    """``deploy --tune``: the model serving tensors (not the ensemble or its preprocessing step)."""

    from ..data import DataOptions  # noqa: PLC0415  # deferred: --help imports every command module; the stage loads only when the command runs
    from ..tune import TuneOptions, tune  # noqa: PLC0415  # deferred: --help imports every command module; the stage loads only when the command runs

    model = next((m for m in report.models if m.backend not in ("ensemble", "python_preprocess", "python_postprocess")
                  and not m.name.endswith(("_ensemble", "_preprocess", "_postprocess"))), None)
    if model is None:
        raise UsageError("--tune: no model to tune was written")
    data = data_spec or (f"{source}:val" if builtin.builtin(source) is not None else None)
    if data is None:
        raise UsageError("--tune needs --data (requests to measure each candidate with)")
    out = Path(repo).resolve().parent / f"tune-{model.name}"
    click.echo(f"tuning {model.name} (report in {out})")
    result = tune(repo, TuneOptions(model=model.name, budget_s=budget_s), data=DataOptions(spec=data, preprocess=preprocess, limit=64),
                  apply=True, report_dir=out, say=click.echo)
    gain = "" if result.gain is None else f" ({result.gain:.2f}x the default's throughput)"
    click.echo(f"tuned {model.name}: {result.chosen.label()}{gain}; wrote {result.applied}")
    return result
