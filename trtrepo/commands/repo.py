"""``trtrepo repo list`` and ``trtrepo repo add``."""

from __future__ import annotations

from typing import Any

import click

from ..contracts import backends
from ._inputs import io_paths
from ._model_options import build_model_options, model_config_options


@click.group("repo")
def command() -> None:
    """Inspect and write Triton model repositories (REPO/NAME/VERSION/model.<ext> + config.pbtxt)."""


@command.command("list")
@click.argument("repo", type=click.Path(file_okay=False), default="model_repository")
def list_cmd(repo: str) -> None:
    """Show the models of REPO, their versions and what each version folder holds."""
    from ..repository import list_repository

    entries = list_repository(repo)
    if not entries:
        click.echo(f"{repo}: no models")
        return
    for e in entries:
        mbs = "?" if e.max_batch_size is None else str(e.max_batch_size)
        click.echo(f"{e.name}  [{e.kind}, max_batch_size {mbs}]  inputs: {', '.join(e.inputs) or '-'}  "
                   f"outputs: {', '.join(e.outputs) or '-'}")
        if e.problem:
            click.echo(f"  problem: {e.problem}")
        for v, files in sorted(e.versions.items()):
            click.echo(f"  {v}/  {', '.join(files) if files else '(empty)'}")


@command.command("add")
@click.argument("model_file", type=click.Path(dir_okay=False))
@click.option("--repo", default="model_repository", show_default=True, type=click.Path(file_okay=False))
@click.option("--name", required=True, help="Model name (the folder name in the repository).")
@click.option("--backend", type=click.Choice(backends.options()), default=None,
              help="Default: tensorrt for .plan/.engine files, onnxruntime for .onnx.")
@click.option("--onnx", "onnx_for_io", type=click.Path(dir_okay=False, exists=True), default=None,
              help="For a plan without model.plan.json: the ONNX model it was built from (its IO).")
@click.option("--labels-file", type=click.Path(dir_okay=False, exists=True), default=None,
              help="Class names, one per line: copied in as labels.txt (label_filename of the output).")
@click.option("--label-output", default=None, help="Output the labels belong to (default: the only 1-D output).")
@click.option("--target-tensorrt", default=None, metavar="VERSION", help="TensorRT version of the target server (warns on mismatch).")
@click.option("--target-cc", default=None, metavar="X.Y", help="Compute capability of the target GPU (warns on mismatch).")
@model_config_options
@io_paths({"model_file": "MODEL_FILE", "onnx_for_io": "--onnx", "labels_file": "--labels-file"},
          {"repo": "--repo"})
def add_cmd(model_file: str, repo: str, name: str, backend: str | None, onnx_for_io: str | None, labels_file: str | None,
            label_output: str | None, target_tensorrt: str | None, target_cc: str | None, **kw: Any) -> None:
    """Add MODEL_FILE (.onnx or TensorRT .plan) to a repository as a new version, with a validated config.pbtxt."""
    from dataclasses import replace
    from pathlib import Path

    from ..errors import UsageError
    from ..modelio import ModelIO
    from ..repository import add_onnx_model, add_plan_model
    from ..server import find_python_env

    options = build_model_options(kw)
    if label_output:
        options = replace(options, label_output=label_output)
    path = Path(model_file)
    if not path.is_file():
        raise UsageError(f"{path}: model file not found")
    if backend is None:
        backend = backends.options("plan" if path.suffix in (".plan", ".engine") else "onnx")[0]
    common = {"version": kw.pop("version"), "force": kw.pop("force"), "template_dir": kw.pop("template_dir")}
    spec = backends.for_option(backend)
    if spec is not None and spec.source == "plan":
        io = ModelIO.from_onnx(onnx_for_io) if onnx_for_io else None
        result, _ = add_plan_model(repo, name, path, io=io, options=options, labels=labels_file,
                                   target_tensorrt=target_tensorrt, target_compute_capability=target_cc, **common)
    else:
        if path.suffix != ".onnx":
            raise UsageError(f"{path}: --backend {backend} takes an .onnx model")
        if spec is not None and spec.runs_python and options.execution_env is None:
            env = find_python_env()
            options = replace(options, execution_env=str(env) if env else None)
        result, _ = add_onnx_model(repo, name, path, backend=backend, options=options, labels=labels_file, **common)
    for w in result.warnings:
        click.echo(f"warning: {w}", err=True)
    verb = "replaced" if result.replaced else "added"
    click.echo(f"{verb} {result.name} version {result.version}: {result.version_dir} ({', '.join(result.files)})")
