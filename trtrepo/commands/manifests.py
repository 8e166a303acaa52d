"""``trtrepo manifests``."""

from __future__ import annotations

import click

from ._inputs import io_paths
from ._output import json_option, summary_output


@click.command("manifests")
@click.argument("repo_url")
@click.option("-o", "--output", "out_dir", required=True, type=click.Path(file_okay=False),
              help="Folder for the manifests (created if missing).")
@click.option("--repository-url", default=None, metavar="URL",
              help="What the pods read (s3://, gs://, as://) when REPO_URL is a local folder: facts come from REPO_URL, "
                   "Triton loads URL.")
@click.option("--name", default="triton", show_default=True, help="Name of the Deployment, Service, HPA and InferenceService.")
@click.option("--namespace", default="default", show_default=True)
@click.option("--replicas", type=int, default=2, show_default=True, help="Pods the Deployment starts with.")
@click.option("--min-replicas", type=int, default=1, show_default=True, help="HorizontalPodAutoscaler minimum.")
@click.option("--max-replicas", type=int, default=4, show_default=True, help="HorizontalPodAutoscaler maximum.")
@click.option("--target-cpu", "target_cpu_percent", type=int, default=70, show_default=True,
              help="HorizontalPodAutoscaler target: average CPU utilization, percent of the CPU request.")
@click.option("--cpu-request", default="1", show_default=True)
@click.option("--cpu-limit", default="2", show_default=True)
@click.option("--memory-request", default="2Gi", show_default=True)
@click.option("--memory-limit", default="4Gi", show_default=True)
@click.option("--gpus", type=int, default=None,
              help="nvidia.com/gpu per pod (default: 1 when the repository holds TensorRT plans or KIND_GPU instance "
                   "groups, else 0).")
@click.option("--image", default=None,
              help="Triton image (default: nvcr.io/nvidia/tritonserver:<release>-py3, the release whose TensorRT matches "
                   "the plans').")
@click.option("--credentials-secret", default=None, help="Secret holding the storage credentials [default: NAME-storage-credentials].")
@click.option("--service-account", default=None,
              help="KServe variant: an existing service account listing the credentials secret [default: write NAME-kserve].")
@click.option("--s3-endpoint", default=None, metavar="URL",
              help="Custom S3 endpoint (MinIO, Ceph, ...): http(s)://HOST[:PORT]; Triton is given s3://http(s)://HOST:PORT/BUCKET/PREFIX.")
@click.option("--model-control-mode", type=click.Choice(["none", "poll"]), default="none", show_default=True,
              help="poll: Triton reloads models that change in the repository.")
@click.option("--repository-poll-secs", type=int, default=None, help="With --model-control-mode poll [default: 15].")
@click.option("--startup-seconds", type=int, default=600, show_default=True,
              help="How long the startup probe waits for every model to load.")
@click.option("--force", is_flag=True, help="Overwrite existing files in the output folder.")
@json_option
@io_paths({"repo_url": "REPO_URL"}, {"out_dir": "-o"})
def command(repo_url: str, out_dir: str, repository_url: str | None, name: str, namespace: str, replicas: int,
            min_replicas: int, max_replicas: int, target_cpu_percent: int, cpu_request: str, cpu_limit: str,
            memory_request: str, memory_limit: str, gpus: int | None, image: str | None, credentials_secret: str | None,
            service_account: str | None, s3_endpoint: str | None, model_control_mode: str,
            repository_poll_secs: int | None, startup_seconds: int, force: bool, as_json: bool) -> None:
    """Write Kubernetes manifests for a Triton fleet serving the model repository REPO_URL
    (s3://BUCKET/PREFIX, gs://BUCKET/PREFIX, as://ACCOUNT/CONTAINER/PREFIX, or a local folder with
    --repository-url): deployment.yaml, service.yaml, hpa.yaml, secret.example.yaml and, as an
    alternative to the first three, kserve-inferenceservice.yaml.

    The image is the Triton release whose TensorRT matches the plans' (one GPU per pod when the
    repository needs a GPU); probes watch /v2/health/ready and /v2/health/live. Existing files are
    refused (exit 2) without --force.
    """
    from ..manifests import ManifestOptions, manifest_values, render_values, repository_facts, write_manifests  # noqa: PLC0415  # deferred: --help imports every command module; the stage loads only when the command runs

    options = ManifestOptions(
        name=name, namespace=namespace, replicas=replicas, min_replicas=min_replicas, max_replicas=max_replicas,
        target_cpu_percent=target_cpu_percent, cpu_request=cpu_request, cpu_limit=cpu_limit,
        memory_request=memory_request, memory_limit=memory_limit, gpus=gpus, image=image,
        credentials_secret=credentials_secret, service_account=service_account, s3_endpoint=s3_endpoint,
        repository_url=repository_url, model_control_mode=model_control_mode,
        repository_poll_secs=repository_poll_secs, startup_seconds=startup_seconds)
    with summary_output(as_json) as emit:
        facts = repository_facts(repo_url, s3_endpoint=s3_endpoint)
        values = manifest_values(repo_url, facts, options)
        written = write_manifests(render_values(values), out_dir, force=force)
        for path in written:
            click.echo(f"wrote {path}")
        for note in values.notes:
            click.echo(f"note: {note}")
        click.echo(f"apply: kubectl apply -f {out_dir}/deployment.yaml -f {out_dir}/service.yaml -f {out_dir}/hpa.yaml "
                   f"(or, with KServe: kubectl apply -f {out_dir}/kserve-inferenceservice.yaml)")
        emit({"written": [str(p) for p in written], "models": list(facts.models), "image": values.image,
              "repository_url": values.triton_url, "storage_uri": values.storage_uri, "gpus": values.gpus,
              "notes": list(values.notes)})
