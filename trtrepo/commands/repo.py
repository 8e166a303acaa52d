"""``trtrepo repo list`` and ``trtrepo repo add``."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import click

from ..contracts import backends
from ..contracts.location import is_remote
from ..errors import UsageError
from ..fsutil import temp_dir
from ..modelio import ModelIO
from ..progress import status
from ._inputs import io_paths
from ._model_options import build_model_options, model_config_options
from ._options import s3_endpoint_option


@click.group("repo")
def command() -> None:
    """Inspect and write Triton model repositories (REPO/NAME/VERSION/model.<ext> + config.pbtxt)."""


@command.command("check")
@click.argument("repo", type=click.Path(file_okay=False), default="model_repository")
@s3_endpoint_option
@click.option("--json", "as_json", is_flag=True, help="Print the findings as JSON.")
@click.option("--fix", is_flag=True, help="Recover interrupted writes (what the next write would do) before checking.")
def check_cmd(repo: str, s3_endpoint: str | None, as_json: bool, fix: bool) -> None:
    """Report what ties REPO to this machine: absolute paths in its files, symlinks, an
    EXECUTION_ENV_PATH outside the model folder; as notes, the TensorRT version and GPU of each plan.
    Also the leftovers of interrupted writes (a killed 'deploy' or 'repo add'), which --fix
    removes (a model moved aside by an interrupted swap goes back first).

    Also every top-level folder tritonserver would fail to load (it tries each one, hidden ones
    too, and does not start while one fails): no config.pbtxt, a config that does not parse, no
    version with a model file, a served model file that its runtime does not load, a tensor type
    the backend cannot carry. Every served model file is loaded, always (no --deep: ONNX Runtime
    in one child process takes about 0.15 s to start and milliseconds per small model; a plan is
    deserialised where TensorRT of its version is installed). The model files of an s3://
    repository are not loaded.

    Exit code 0 when REPO can be copied to another machine or container and Triton loads every
    folder, 1 when something host-specific, left over or not loadable is found, 2 when REPO is
    not a directory."""

    fixed: list[str] = []
    if is_remote(repo):
        findings = _check_remote(repo, s3_endpoint, fix, fixed)
    else:
        findings = _check_local(repo, fix, fixed)
    if not as_json:
        for line in fixed:
            click.echo(f"fixed: {line}")
    host = [f for f in findings if f.kind == "host"]
    broken = [f for f in findings if f.kind == "broken"]
    if as_json:
        click.echo(json.dumps({"repo": repo, "portable": not host, "loadable": not broken, "fixed": fixed,
                               "findings": [f.to_dict() for f in findings]}, indent=2))
    else:
        for f in findings:
            label = {"host": "host-specific", "broken": "not loadable"}.get(f.kind, "note")
            click.echo(f"{label}: {f.path}: {f.message}")
        click.echo(f"{repo}: {'not portable' if host else 'portable'} ({len(host)} host-specific finding(s))"
                   + (f"; {len(broken)} folder(s) Triton fails to load" if broken else ""))
    if host or broken:
        raise SystemExit(1)


def _check_local(repo: str, fix: bool, fixed: list[str]) -> list[Any]:
    from ..repository import (  # noqa: PLC0415  # deferred: --help imports every command module; the stage loads only when the command runs
        Finding,
        host_specific,
        leftover_note,
        leftovers,
        load_problems,
        recover,
        repository_lock,
        runtime_problems,
    )

    findings = host_specific(repo)
    if fix:
        with repository_lock(Path(repo)):
            fixed += recover(Path(repo))
    findings += [Finding(str(p), "host", f"left by an interrupted write ({leftover_note(repo, p)}; "
                         "'trtrepo repo check --fix' or the next write removes it)") for p in leftovers(repo)]
    findings += [Finding(str(p), "broken", why) for p, why in load_problems(repo)]
    findings += [Finding(str(p), "broken", why) for p, why in runtime_problems(repo)]
    return findings


def _check_remote(repo: str, s3_endpoint: str | None, fix: bool, fixed: list[str]) -> list[Any]:
    """An s3:// repository: its configs' host-specific paths, the objects of interrupted uploads,
    and what Triton would fail to load."""

    from ..objectstore import finishable_uploads, open_store, remote_leftovers, remote_problems, remove_leftovers, snapshot  # noqa: PLC0415  # deferred: --help imports every command module; the stage loads only when the command runs
    from ..repository import Finding, host_specific  # noqa: PLC0415  # deferred: --help imports every command module; the stage loads only when the command runs

    store = open_store(repo, s3_endpoint)
    if fix:
        fixed += remove_leftovers(store)
    with temp_dir("s3-check") as tmp:
        local = snapshot(store.loc.url, Path(tmp) / "repo")
        findings = [Finding(f"{store.loc.url}/{Path(f.path).relative_to(local)}", f.kind, f.message)
                    for f in host_specific(local)]
    finishable = finishable_uploads(store)
    for what, keys in remote_leftovers(store):
        name = what.partition("/")[0]
        if what.endswith("(no config.pbtxt)"):
            then = "finishes the upload (it is complete in the staging area)" if name in finishable else "removes it"
            findings.append(Finding(f"{store.loc.url}/{name}/", "broken",
                                    f"{len(keys)} object(s) of an interrupted first upload without config.pbtxt: Triton "
                                    f"fails to load this folder and does not start while it is here; "
                                    f"'trtrepo repo check --fix' {then}"))
        else:
            where = what if what.startswith("s3://") else f"{store.loc.url}/{what}"
            findings.append(Finding(where, "host", f"{len(keys)} object(s) left by an interrupted "
                                    f"upload (not served; 'trtrepo repo check --fix' or the next write of the model "
                                    f"removes them)"))
    findings += [Finding(f"{store.loc.url}/{where}", "broken", why) for where, why in remote_problems(store)]
    return findings


@command.command("list")
@click.argument("repo", type=click.Path(file_okay=False), default="model_repository")
@s3_endpoint_option
def list_cmd(repo: str, s3_endpoint: str | None) -> None:
    """Show the models of REPO (a folder or s3://BUCKET/PREFIX), their versions and what each version folder holds."""
    from ..objectstore import list_remote  # noqa: PLC0415  # deferred: --help imports every command module; the stage loads only when the command runs
    from ..repository import list_repository  # noqa: PLC0415  # deferred: --help imports every command module; the stage loads only when the command runs

    entries = list_remote(repo, s3_endpoint) if is_remote(repo) else list_repository(repo)
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


def _backend_for(path: Path, backend: str | None) -> tuple[str, Any]:
    """The backend and its spec. Decision: by default tensorrt for a .plan/.engine file, else the
    ONNX default; a backend that does not serve plans takes an .onnx file only."""
    if backend is None:
        backend = backends.options("plan" if path.suffix in (".plan", ".engine") else "onnx")[0]
    spec = backends.for_option(backend)
    if (spec is None or spec.source != "plan") and path.suffix != ".onnx":
        raise UsageError(f"{path}: --backend {backend} takes an .onnx model")
    return backend, spec


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
@s3_endpoint_option
@model_config_options
@io_paths({"model_file": "MODEL_FILE", "onnx_for_io": "--onnx", "labels_file": "--labels-file"},
          {"repo": "--repo"})
def add_cmd(model_file: str, repo: str, name: str, backend: str | None, onnx_for_io: str | None, labels_file: str | None,
            label_output: str | None, target_tensorrt: str | None, target_cc: str | None, s3_endpoint: str | None,
            **kw: Any) -> None:
    """Add MODEL_FILE (.onnx or TensorRT .plan) to a repository as a new version, with a validated config.pbtxt.

    Before anything is written, MODEL_FILE is loaded by the runtime that will serve it (ONNX
    Runtime with the config's providers; a plan deserialised where TensorRT of its version is
    installed), in a child process with a time and memory limit: a model it does not load, or a
    tensor type the backend cannot carry (bfloat16 through the Python backend), is refused (exit 2)."""

    from ..repository import PlanTarget, add_onnx_model, add_plan_model  # noqa: PLC0415  # deferred: --help imports every command module; the stage loads only when the command runs
    from ..server import missing_backend_warning  # noqa: PLC0415  # deferred: --help imports every command module; the stage loads only when the command runs
    from ..tritonconfig import execution_env_warning  # noqa: PLC0415  # deferred: --help imports every command module; the stage loads only when the command runs

    options = build_model_options(kw)
    if label_output:
        options = replace(options, label_output=label_output)
    path = Path(model_file)
    if not path.is_file():
        raise UsageError(f"{path}: model file not found")
    backend, spec = _backend_for(path, backend)
    common = {"version": kw.pop("version"), "force": kw.pop("force"), "template_dir": kw.pop("template_dir")}

    def write(into: str | Path) -> Any:
        if spec is not None and spec.source == "plan":
            io = ModelIO.from_onnx(onnx_for_io) if onnx_for_io else None
            return add_plan_model(into, name, path, io=io, options=options, labels=labels_file,
                                  target=PlanTarget(target_tensorrt, target_cc), **common)[0]
        return add_onnx_model(into, name, path, backend=backend, options=options, labels=labels_file, **common)[0]

    where: str | Path
    if is_remote(repo):  # written into a local stand-in, then uploaded (trtrepo.objectstore's protocol)
        from ..objectstore import checkout, open_store, publish  # noqa: PLC0415  # deferred: --help imports every command module; the stage loads only when the command runs

        store = open_store(repo, s3_endpoint)
        with temp_dir("s3-repo") as tmp:
            local = Path(tmp) / "repo"
            checkout(store, local)
            result = write(local)
            pub = publish(store, local, result.name, result.version, replaced=result.replaced,
                          allocated=common["version"] is None, say=status)
        if pub.version != result.version and result.replaced:
            click.echo(f"note: version {result.version} exists and object storage has no rename: written as version "
                       f"{pub.version}, version {result.version} retired", err=True)
        elif pub.version != result.version:
            click.echo(f"note: another writer took version {result.version} meanwhile: written as version {pub.version}",
                       err=True)
        version, where = pub.version, pub.url
    else:
        result = write(repo)
        version, where = result.version, result.version_dir
    extra = [missing_backend_warning(spec.server_backend) if spec is not None and spec.server_backend else None]
    if spec is not None and spec.runs_python and options.execution_env:
        extra.append(execution_env_warning(options.execution_env))
    for w in [*result.warnings, *(w for w in extra if w)]:
        click.echo(f"warning: {w}", err=True)
    verb = "replaced" if result.replaced else "added"
    click.echo(f"{verb} {result.name} version {version}: {where} ({', '.join(result.files)})")
