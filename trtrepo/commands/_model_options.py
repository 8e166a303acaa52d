"""Triton config options shared by ``trtrepo repo add`` and ``trtrepo deploy``."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from ..errors import UsageError

F = TypeVar("F", bound=Callable[..., Any])


def model_config_options(f: F) -> F:
    """``--max-batch-size --preferred-batch-size --max-queue-delay --no-dynamic-batching --instance-kind
    --instance-count --gpus --cuda-graphs --warmup --version-policy --response-cache --parameter
    --intra-op-threads --python-env --template-dir --version --force``."""
    opts = [
        click.option("--max-batch-size", type=click.IntRange(min=0), default=None,
                     help="Triton max_batch_size (default: the plan's profile maximum, else 32; 0 without a batch axis)."),
        click.option("--preferred-batch-size", "preferred_batch_sizes", type=click.IntRange(min=1), multiple=True,
                     help="dynamic_batching preferred_batch_size (repeat)."),
        click.option("--max-queue-delay", "max_queue_delay_us", type=click.IntRange(min=0), default=100, show_default=True,
                     help="dynamic_batching max_queue_delay_microseconds."),
        click.option("--dynamic-batching/--no-dynamic-batching", default=True, show_default=True),
        click.option("--instance-kind", type=click.Choice(["auto", "gpu", "cpu", "model"]), default="auto", show_default=True,
                     help="instance_group kind (auto: GPU for plans, CPU for Python models, KIND_AUTO for ONNX Runtime)."),
        click.option("--instance-count", type=click.IntRange(min=1, max=128), default=1, show_default=True),
        click.option("--gpus", default=None, metavar="0,1", help="instance_group GPU ids."),
        click.option("--cuda-graphs", is_flag=True, help="optimization.cuda.graphs (TensorRT plans only)."),
        click.option("--warmup", is_flag=True, help="Add model_warmup with zero inputs at max batch."),
        click.option("--version-policy", default=None, metavar="POLICY", help="latest[:N], all or specific:V1,V2."),
        click.option("--response-cache", is_flag=True, help="response_cache { enable: true } (server needs --cache-config)."),
        click.option("--parameter", "parameters", multiple=True, metavar="KEY=VALUE", help="Free-form config parameter (repeat)."),
        click.option("--intra-op-threads", type=click.IntRange(min=0), default=None,
                     help="ONNX Runtime intra-op threads in Python-backend models (default: the cores available "
                          "here divided by --instance-count, at least 1; 0: ONNX Runtime's own default)."),
        click.option("--python-env", "python_env", type=click.Path(exists=True), default=None, metavar="ENV.tar.gz|DIR",
                     help="EXECUTION_ENV_PATH of Python-backend models. A packed environment (conda-pack .tar.gz) is "
                          "copied into the model folder ($$TRITON_MODEL_DIRECTORY/ENV.tar.gz, portable); a directory "
                          "is named as is (host-specific). Default: none, the server's own Python ('trtrepo serve' "
                          "gives it $TRTREPO_PYTHON_ENV or .triton/pyenv)."),
        click.option("--template-dir", type=click.Path(file_okay=False, exists=True), default=None,
                     help="Folder whose templates override the shipped ones by file name."),
        click.option("--version", "version", type=click.IntRange(min=1, max=2**63 - 1), default=None,
                     help="Model version to write (default: a new version after the newest)."),
        click.option("--force", is_flag=True, help="Replace an existing version."),
    ]
    for o in reversed(opts):
        f = o(f)
    return f


def build_model_options(kw: dict[str, Any]) -> Any:
    """Pop the options of :func:`model_config_options` from ``kw`` into a ``ModelOptions``."""

    from ..tritonconfig import ModelOptions, is_env_archive  # noqa: PLC0415  # deferred: --help imports every command module; the stage loads only when the command runs

    params = []
    for p in kw.pop("parameters"):
        key, sep, value = p.partition("=")
        if not sep or not key:
            raise UsageError(f"--parameter {p!r}: expected KEY=VALUE")
        params.append((key, value))
    gpus_text = kw.pop("gpus")
    try:
        gpus = tuple(int(g) for g in gpus_text.split(",")) if gpus_text else ()
    except ValueError as exc:
        raise UsageError(f"--gpus {gpus_text!r}: expected comma-separated integers") from exc
    python_env = kw.pop("python_env")
    if python_env is not None and Path(python_env).is_file() and not is_env_archive(python_env):
        raise UsageError(f"--python-env {python_env}: expected a packed environment (.tar.gz, e.g. from conda-pack) "
                         f"or a directory")
    return ModelOptions(
        max_batch_size=kw.pop("max_batch_size"),
        dynamic_batching=kw.pop("dynamic_batching"),
        preferred_batch_sizes=tuple(kw.pop("preferred_batch_sizes")),
        max_queue_delay_us=kw.pop("max_queue_delay_us"),
        instance_kind=kw.pop("instance_kind"),
        instance_count=kw.pop("instance_count"),
        gpus=gpus,
        cuda_graphs=kw.pop("cuda_graphs"),
        warmup=kw.pop("warmup"),
        version_policy=kw.pop("version_policy"),
        response_cache=kw.pop("response_cache"),
        parameters=tuple(params),
        intra_op_threads=kw.pop("intra_op_threads"),
        execution_env=python_env,
    )
