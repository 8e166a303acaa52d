"""Kubernetes manifests for a Triton fleet reading a model repository from object storage.

Three steps, the middle one pure:

1. :func:`repository_facts` reads what the manifests depend on (model names, the TensorRT version
   of the plans, Python-backend models, whether a GPU is needed) from a local folder, or from a
   snapshot of an ``s3://`` / ``gs://`` / ``as://`` repository (its ``config.pbtxt`` and
   ``*.plan.json`` files, fetched by ``trtrepo.objectstore``).
2. :func:`manifest_values` decides every value (image and Triton release, the URL Triton is given,
   credentials, resources, probes) and the notes for the user; :func:`render_values` lays them out
   through the jinja2 templates in ``templates/k8s/``. :func:`render_manifests` is both.
3. :func:`write_manifests` writes the files, each atomically, refusing to overwrite without ``force``.

Files: ``deployment.yaml`` (apps/v1), ``service.yaml`` (v1), ``hpa.yaml`` (autoscaling/v2),
``secret.example.yaml`` (v1, placeholders only) and ``kserve-inferenceservice.yaml`` (a v1
ServiceAccount and a serving.kserve.io/v1beta1 InferenceService with the Triton predictor).
"""

from __future__ import annotations

import json
import re
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from decimal import Decimal
from importlib import resources
from pathlib import Path
from typing import Any

from .contracts.backends import for_config
from .contracts.location import parse_endpoint, parse_storage_url
from .contracts.plan import read_plan_metadata
from .errors import OptionError, UsageError
from .fsutil import atomic_write_text
from .objectstore import snapshot
from .repository import host_specific, list_repository, read_config
from .server import plan_tensorrt_versions, release_for_tensorrt
from .tritonconfig import MODEL_DIRECTORY

FILES = ("deployment.yaml", "service.yaml", "hpa.yaml", "secret.example.yaml", "kserve-inferenceservice.yaml")
TRITON_IMAGE = "nvcr.io/nvidia/tritonserver"
PLACEHOLDER = "REPLACE_ME"
# KServe's names (pkg/credentials/gcs): the key of the service-account JSON in the secret.
GCS_KEY_FILE = "gcloud-application-credentials.json"
GCS_MOUNT = "/var/secrets/gcp"

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")  # RFC 1123 label (namespaces)
_DNS_1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")  # RFC 1035 label (Service names)
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_QUANTITY = re.compile(r"^([0-9]+(?:\.[0-9]+)?|\.[0-9]+)(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?$")
_SUFFIX = {"": Decimal(1), "m": Decimal("0.001"), "k": Decimal(10) ** 3, "M": Decimal(10) ** 6, "G": Decimal(10) ** 9,
           "T": Decimal(10) ** 12, "P": Decimal(10) ** 15, "E": Decimal(10) ** 18, "Ki": Decimal(2) ** 10,
           "Mi": Decimal(2) ** 20, "Gi": Decimal(2) ** 30, "Ti": Decimal(2) ** 40, "Pi": Decimal(2) ** 50,
           "Ei": Decimal(2) ** 60}
# Triton applies a custom S3 endpoint only when the whole path matches this (core's s3.h, s3_regex_);
# otherwise it silently talks to AWS with the host taken for the bucket.


# --------------------------------------------------------------------------------------------
# Facts about the repository


@dataclass(frozen=True)
class RepositoryFacts:
    """What the manifests depend on. ``tensorrt_versions``: of the plans (``model.plan.json``);
    ``gpu_models``: models that need a GPU (TensorRT plans, ``KIND_GPU`` instance groups);
    ``python_env_models``: Python-backend models that ship their environment in the model folder
    (``EXECUTION_ENV_PATH`` under ``$$TRITON_MODEL_DIRECTORY``); ``host_specific``: what ties the
    repository to the machine it was made on (``trtrepo repo check``)."""

    models: tuple[str, ...] = ()
    tensorrt_versions: tuple[str, ...] = ()
    python_models: tuple[str, ...] = ()
    gpu_models: tuple[str, ...] = ()
    python_env_models: tuple[str, ...] = ()
    plans_without_metadata: tuple[str, ...] = ()
    compute_capabilities: tuple[str, ...] = ()
    host_specific: tuple[str, ...] = ()
    source: str = ""

    @property
    def needs_gpu(self) -> bool:
        return bool(self.gpu_models or self.tensorrt_versions or self.plans_without_metadata)


def facts_from_folder(path: str | Path, *, snapshot: bool = False) -> RepositoryFacts:
    """Facts of a local repository. ``snapshot``: the folder holds only the ``config.pbtxt`` and
    ``*.plan.json`` files of a remote repository, so findings about missing files are not made."""
    from tritonclient.grpc import model_config_pb2

    KIND_GPU = model_config_pb2.ModelInstanceGroup.KIND_GPU
    repo = Path(path)
    entries = list_repository(repo)
    python, python_env, gpu, no_meta, host = [], [], [], [], []
    ccs: set[str] = set()
    for e in entries:
        if e.problem:
            host.append(f"{e.name}: {e.problem}")
            continue
        cfg = read_config(repo / e.name)
        spec = for_config(cfg.platform, cfg.backend)
        is_plan = spec is not None and spec.engine
        if is_plan or any(g.kind == KIND_GPU for g in cfg.instance_group):
            gpu.append(e.name)
        if cfg.backend == "python":
            python.append(e.name)
            if _ships_python_env(cfg):
                python_env.append(e.name)
        if is_plan:
            complete, plan_ccs = _plan_compute_capabilities(repo / e.name)
            if not complete:
                no_meta.append(e.name)
            ccs |= plan_ccs
    for f in host_specific(repo):
        if f.kind == "host" and not (snapshot and "is missing" in f.message):
            host.append(f"{f.path}: {f.message}")
    return RepositoryFacts(
        models=tuple(e.name for e in entries), tensorrt_versions=tuple(sorted(plan_tensorrt_versions(repo))),
        python_models=tuple(python), gpu_models=tuple(gpu), python_env_models=tuple(python_env),
        plans_without_metadata=tuple(dict.fromkeys(no_meta)), compute_capabilities=tuple(sorted(ccs)),
        host_specific=tuple(host), source=str(path))


def _ships_python_env(cfg: Any) -> bool:
    """Decision: a Python model whose EXECUTION_ENV_PATH lies in its own folder ships its
    environment (an archive copied there)."""
    env = cfg.parameters["EXECUTION_ENV_PATH"].string_value if "EXECUTION_ENV_PATH" in cfg.parameters else ""
    return env.startswith(MODEL_DIRECTORY + "/")


def _plan_compute_capabilities(model_dir: Path) -> tuple[bool, set[str]]:
    """Whether every plan of the model has readable metadata (and there is some), and the compute
    capabilities its plans need. Decision: a plan built hardware-compatible needs none."""
    metas = sorted(model_dir.glob("*/*.plan.json"))
    complete = bool(metas)
    ccs: set[str] = set()
    for m in metas:
        try:
            meta = read_plan_metadata(m)
        except UsageError:
            complete = False
            continue
        if meta is not None and meta.gpu is not None and not meta.hardware_compatibility:
            ccs.add(meta.gpu.compute_capability)
    return complete, ccs


def repository_facts(url: str, *, s3_endpoint: str | None = None) -> RepositoryFacts:
    """Facts of the repository at ``url``: a local folder, or an ``s3://`` / ``gs://`` / ``as://``
    URL whose configs and plan metadata are fetched into a temporary folder first."""
    location = parse_storage_url(url, "repo_url", s3_endpoint)
    if location is None:
        return facts_from_folder(url)
    if location.scheme != "s3":
        raise OptionError("repo_url", f"{url}: trtrepo reads s3:// repositories only; read a local copy instead, with "
                                      f"{{repository_url}} {url}", concept=_CONCEPTS["repo_url"],
                          others={"repository_url": _CONCEPTS["repository_url"]})

    with tempfile.TemporaryDirectory(prefix="trtrepo-manifests-") as tmp:
        dest = Path(tmp) / "repo"
        snapshot(url, dest, endpoint=s3_endpoint)
        facts = facts_from_folder(dest, snapshot=True)
    return replace(facts, source=url)


# --------------------------------------------------------------------------------------------
# Options


# How the library names ManifestOptions' fields in messages (the CLI shows the flags).
_CONCEPTS = {"repo_url": "the repository", "repository_url": "the URL the pods read", "name": "the name",
             "namespace": "the namespace", "credentials_secret": "the credentials secret",
             "service_account": "the service account", "min_replicas": "the minimum replicas",
             "max_replicas": "the maximum replicas", "replicas": "the replicas",
             "target_cpu_percent": "the target CPU percentage", "gpus": "the GPUs per pod",
             "cpu_request": "the CPU request", "cpu_limit": "the CPU limit", "memory_request": "the memory request",
             "memory_limit": "the memory limit", "image": "the image", "model_control_mode": "the model control mode",
             "repository_poll_secs": "the repository poll interval", "startup_seconds": "the startup seconds",
             "http_port": "the HTTP port", "grpc_port": "the gRPC port", "metrics_port": "the metrics port"}


def _option(setting: str, detail: str, *others: str) -> OptionError:
    """An :class:`OptionError` about ``setting`` whose ``detail`` may name ``others`` as ``{name}``."""
    return OptionError(setting, detail, concept=_CONCEPTS[setting], others={o: _CONCEPTS[o] for o in others})


def _quantity(value: str, setting: str) -> Decimal:
    m = _QUANTITY.match(str(value))
    if not m:
        raise _option(setting, f"{value}: not a Kubernetes quantity (e.g. 500m, 2, 4Gi)")
    return Decimal(m.group(1)) * _SUFFIX[m.group(2) or ""]


@dataclass(frozen=True)
class ManifestOptions:
    """Choices for :func:`manifest_values`; checked when made (a :class:`UsageError` naming the
    option). ``gpus`` None: 1 when the repository needs a GPU, else 0. ``repository_url``: what the
    pods read when the facts come from a local folder. ``credentials_secret`` None:
    ``NAME-storage-credentials``; ``service_account`` None: the KServe variant writes ``NAME-kserve``."""

    name: str = "triton"
    namespace: str = "default"
    replicas: int = 2
    min_replicas: int = 1
    max_replicas: int = 4
    target_cpu_percent: int = 70
    cpu_request: str = "1"
    cpu_limit: str = "2"
    memory_request: str = "2Gi"
    memory_limit: str = "4Gi"
    gpus: int | None = None
    image: str | None = None
    credentials_secret: str | None = None
    service_account: str | None = None
    s3_endpoint: str | None = None
    repository_url: str | None = None
    model_control_mode: str = "none"
    repository_poll_secs: int | None = None
    startup_seconds: int = 600
    http_port: int = 8000
    grpc_port: int = 8001
    metrics_port: int = 8002

    def __post_init__(self) -> None:
        self._check_names()
        self._check_scaling()
        self._check_resources()
        self._check_server()

    def _check_names(self) -> None:
        """Kubernetes names: a DNS-1035 label, a DNS-1123 namespace, DNS-1123 subdomains."""
        if len(self.name) > 63 or not _DNS_1035.match(self.name):
            raise _option("name", f"{self.name}: must be a DNS-1035 label (lowercase letters, digits and '-', starting "
                                  f"with a letter, at most 63 characters)")
        if len(self.namespace) > 63 or not _DNS_LABEL.match(self.namespace):
            raise _option("namespace", f"{self.namespace}: must be a DNS-1123 label (lowercase letters, digits and '-', "
                                       f"at most 63 characters)")
        for setting, value in (("credentials_secret", self.credentials_secret), ("service_account", self.service_account)):
            if value is not None and (len(value) > 253 or not _DNS_SUBDOMAIN.match(value)):
                raise _option(setting, f"{value}: must be a DNS-1123 subdomain (lowercase letters, digits, '-' and '.')")

    def _check_scaling(self) -> None:
        """1 <= min_replicas <= replicas <= max_replicas; a positive CPU target."""
        if self.min_replicas < 1:
            raise _option("min_replicas", f"{self.min_replicas}: must be at least 1 (the HorizontalPodAutoscaler's minimum)")
        if self.max_replicas < self.min_replicas:
            raise _option("max_replicas", f"{self.max_replicas}: below {{min_replicas}} {self.min_replicas}", "min_replicas")
        if not self.min_replicas <= self.replicas <= self.max_replicas:
            raise _option("replicas", f"{self.replicas}: outside {{min_replicas}} {self.min_replicas} .. {{max_replicas}} "
                                      f"{self.max_replicas}", "min_replicas", "max_replicas")
        if self.target_cpu_percent < 1:
            raise _option("target_cpu_percent", f"{self.target_cpu_percent}: must be a positive percentage of the CPU request")

    def _check_resources(self) -> None:
        """GPUs 0 or more; each request positive and within its limit; an image reference."""
        if self.gpus is not None and self.gpus < 0:
            raise _option("gpus", f"{self.gpus}: must be 0 or more")
        for kind in ("cpu", "memory"):
            request, limit = getattr(self, f"{kind}_request"), getattr(self, f"{kind}_limit")
            if _quantity(request, f"{kind}_request") > _quantity(limit, f"{kind}_limit"):
                raise _option(f"{kind}_request", f"{request}: more than {{{kind}_limit}} {limit}", f"{kind}_limit")
            if _quantity(request, f"{kind}_request") <= 0:
                raise _option(f"{kind}_request", f"{request}: must be more than 0")
        if self.image is not None and (not self.image or any(c.isspace() for c in self.image)):
            raise _option("image", f"{self.image!r}: not an image reference")

    def _check_server(self) -> None:
        """The server's model control (polling only with poll), startup time, distinct ports, endpoint."""
        if self.model_control_mode not in ("none", "poll"):
            raise _option("model_control_mode", f"{self.model_control_mode}: choose none or poll")
        if self.repository_poll_secs is not None:
            if self.model_control_mode != "poll":
                raise _option("repository_poll_secs", f"{self.repository_poll_secs}: only with {{model_control_mode}} poll",
                              "model_control_mode")
            if self.repository_poll_secs < 1:
                raise _option("repository_poll_secs", f"{self.repository_poll_secs}: must be at least 1")
        if self.startup_seconds < 10:
            raise _option("startup_seconds", f"{self.startup_seconds}: must be at least 10")
        ports = {"http_port": self.http_port, "grpc_port": self.grpc_port, "metrics_port": self.metrics_port}
        for setting, port in ports.items():
            if not 0 < port < 65536:
                raise _option(setting, f"{port}: must be 1-65535")
        if len(set(ports.values())) < 3:
            raise OptionError("", f"ports {', '.join(f'{{{k}}} {v}' for k, v in ports.items())}: must differ",
                              others={k: _CONCEPTS[k] for k in ports})
        if self.s3_endpoint is not None:
            parse_endpoint(self.s3_endpoint)

    @property
    def secret_name(self) -> str:
        return self.credentials_secret or f"{self.name}-storage-credentials"


# --------------------------------------------------------------------------------------------
# Values (pure)


@dataclass(frozen=True)
class EnvVar:
    name: str
    value: str | None = None
    secret_key: str | None = None  # from the credentials secret
    optional: bool = False


@dataclass(frozen=True)
class Volume:
    name: str
    mount_path: str
    secret_name: str | None = None  # else a memory-backed emptyDir


@dataclass(frozen=True)
class ManifestValues:
    """Every value the templates lay out, and the notes for the user."""

    name: str
    namespace: str
    labels: tuple[tuple[str, str], ...]
    selector: tuple[tuple[str, str], ...]
    annotations: tuple[tuple[str, str], ...]
    replicas: int
    min_replicas: int
    max_replicas: int
    target_cpu_percent: int
    image: str
    runtime_version: str
    triton_url: str
    storage_uri: str
    scheme: str
    args: tuple[str, ...]
    ports: tuple[tuple[str, int], ...]
    requests: tuple[tuple[str, str], ...]
    limits: tuple[tuple[str, str], ...]
    gpus: int
    env: tuple[EnvVar, ...]
    volumes: tuple[Volume, ...]
    kserve_volumes: tuple[Volume, ...]
    startup_failure_threshold: int
    secret_name: str
    secret_annotations: tuple[tuple[str, str], ...]
    secret_data: tuple[tuple[str, str, str], ...]  # key, placeholder value, comment
    secret_command: str
    service_account: str
    write_service_account: bool
    notes: tuple[str, ...] = field(default_factory=tuple)


def _image_tag(image: str) -> str:
    last = image.rsplit("/", 1)[-1]
    return last.split(":", 1)[1].split("@", 1)[0] if ":" in last else "latest"


def manifest_values(repo_url: str, facts: RepositoryFacts, options: ManifestOptions) -> ManifestValues:
    """Decide every value of the manifests for the repository at ``repo_url`` (what the pods read
    unless ``options.repository_url`` says otherwise) described by ``facts``. Pure: no I/O but
    the packaged release table. ``notes`` keep the order: location, image, GPUs, Python backend,
    portability, polling, shared memory, credentials."""
    notes: list[str] = []
    location = _location(repo_url, facts, options, notes)
    image, choice, version = _image(repo_url, facts, options, notes)
    gpus = _gpus(facts, options, notes)

    # Python backend
    plain = [n for n in facts.python_models if n not in facts.python_env_models]
    if plain:
        notes.append(f"Python-backend models ({', '.join(plain)}) run in the image's own Python, which needs numpy, "
                     f"onnxruntime and pillow: build an image FROM {image} with 'pip install onnxruntime pillow' and pass "
                     f"--image, or redeploy with --python-env ENV.tar.gz")
    for finding in facts.host_specific:
        notes.append(f"not portable: {finding}")

    # Triton's command line
    args = [f"--model-repository={location.triton_url()}", f"--http-port={options.http_port}",
            f"--grpc-port={options.grpc_port}", f"--metrics-port={options.metrics_port}"]
    if options.model_control_mode == "poll":
        args += ["--model-control-mode=poll", f"--repository-poll-secs={options.repository_poll_secs or 15}"]
        notes.append("KServe's variant loads the models its storage initializer downloaded at start: polling applies to "
                     "the Deployment only")

    # credentials
    secret = options.secret_name
    env, volumes, data, secret_annotations = _credentials(location, secret)
    kserve_volumes: list[Volume] = []
    if facts.python_models:  # the Python backend's shared memory; the default /dev/shm of a pod is 64 MB
        volumes.append(Volume("dshm", "/dev/shm"))
        kserve_volumes.append(Volume("dshm", "/dev/shm"))
        notes.append("Python-backend models use /dev/shm: a memory-backed volume is mounted there (it counts against "
                     "the memory limit)")
    sources = [f"--from-file={k}=KEY.json" if k == GCS_KEY_FILE else f"--from-literal={k}=..." for k, _, _ in data]
    secret_command = " ".join(["kubectl", "-n", options.namespace, "create", "secret", "generic", secret, *sources])
    notes.append(f"storage credentials: fill in secret.example.yaml and apply it, or: {secret_command}")
    if options.service_account:
        notes.append(f"KServe's variant runs as service account {options.service_account}: list secret {secret} among "
                     f"its secrets (KServe finds the credentials there)")

    requests = [("cpu", options.cpu_request), ("memory", options.memory_request)]
    limits = [("cpu", options.cpu_limit), ("memory", options.memory_limit)]
    if gpus:
        requests.append(("nvidia.com/gpu", str(gpus)))
        limits.append(("nvidia.com/gpu", str(gpus)))

    selector = (("app.kubernetes.io/name", "triton"), ("app.kubernetes.io/instance", options.name))
    labels = (*selector, ("app.kubernetes.io/component", "inference-server"), ("app.kubernetes.io/managed-by", "trtrepo"))
    annotations = (("trtrepo/models", ",".join(facts.models)),
                   ("trtrepo/tensorrt-version", version or "none"),
                   ("trtrepo/image-choice", choice))
    return ManifestValues(
        name=options.name, namespace=options.namespace, labels=labels, selector=selector, annotations=annotations,
        replicas=options.replicas, min_replicas=options.min_replicas, max_replicas=options.max_replicas,
        target_cpu_percent=options.target_cpu_percent, image=image, runtime_version=_image_tag(image),
        triton_url=location.triton_url(), storage_uri=location.kserve_uri(), scheme=location.scheme, args=tuple(args),
        ports=(("http", options.http_port), ("grpc", options.grpc_port), ("metrics", options.metrics_port)),
        requests=tuple(requests), limits=tuple(limits), gpus=gpus, env=tuple(env), volumes=tuple(volumes),
        kserve_volumes=tuple(kserve_volumes), startup_failure_threshold=-(-options.startup_seconds // 10),
        secret_name=secret, secret_annotations=tuple(secret_annotations), secret_data=tuple(data),
        secret_command=secret_command, service_account=options.service_account or f"{options.name}-kserve",
        write_service_account=options.service_account is None, notes=tuple(notes))


def _location(repo_url: str, facts: RepositoryFacts, options: ManifestOptions, notes: list[str]) -> Any:
    """The object-storage location the pods read (a local folder cannot be)."""
    if options.repository_url:
        location = parse_storage_url(options.repository_url, "repository_url", options.s3_endpoint)
        if location is None:
            raise _option("repository_url", f"{options.repository_url}: not an object-storage URL (s3://, gs://, as://); "
                                            f"pods cannot read a local folder")
    else:
        location = parse_storage_url(repo_url, "repo_url", options.s3_endpoint)
        if location is None:
            raise _option("repo_url", f"{repo_url}: a local folder is not reachable from the cluster; upload it and give "
                                      f"{{repository_url}} s3://BUCKET/PREFIX (or gs://, as://) for the pods to read",
                          "repository_url")
    if not facts.models:
        raise UsageError(f"{facts.source or repo_url}: the repository holds no models")
    if options.repository_url and parse_storage_url(repo_url, "repo_url") is None:
        notes.append(f"facts read from the local folder {repo_url}; the pods read {options.repository_url}: upload the "
                     f"repository there first (same layout)")
    return location


def _image(repo_url: str, facts: RepositoryFacts, options: ManifestOptions, notes: list[str]) -> tuple[str, str, str | None]:
    """The Triton image (given, or the release whose TensorRT built the plans), why, and that version."""

    versions = facts.tensorrt_versions
    if len(versions) > 1:
        raise UsageError(f"{facts.source or repo_url}: plans were built with several TensorRT versions "
                         f"({', '.join(versions)}); one Triton release loads only one")
    version = versions[0] if versions else None
    if options.image:
        image = options.image
        choice = f"image given by --image; plans need TensorRT {version}" if version else "image given by --image"
        notes.append(choice)
        if not image.startswith(TRITON_IMAGE + ":"):
            notes.append(f"KServe's variant runs its kserve-tritonserver runtime's image at tag {_image_tag(image)} "
                         f"(runtimeVersion), not {image}")
    else:
        rel = release_for_tensorrt(version)
        image = f"{TRITON_IMAGE}:{rel.release}-py3"
        if version:
            choice = f"plans built with TensorRT {version}: Triton {rel.release} ships TensorRT {rel.tensorrt}"
        else:
            choice = f"no TensorRT plans in the repository: newest known release {rel.release}"
        notes.append(choice)
    if facts.plans_without_metadata:
        notes.append(f"plans of {', '.join(facts.plans_without_metadata)} carry no readable model.plan.json: the TensorRT "
                     f"version they need is unknown; check that {image} ships it")
    return image, choice, version


def _gpus(facts: RepositoryFacts, options: ManifestOptions, notes: list[str]) -> int:
    """GPUs per pod (given, else one when a model needs a GPU), with the scheduling notes."""
    gpus = options.gpus if options.gpus is not None else (1 if facts.needs_gpu else 0)
    if gpus == 0 and facts.needs_gpu:
        notes.append(f"--gpus 0, but {', '.join(facts.gpu_models or facts.models)} need a GPU: they will not load")
    if gpus:
        notes.append(f"each pod requests {gpus} nvidia.com/gpu: the cluster needs the NVIDIA device plugin (or GPU operator); "
                     f"the HorizontalPodAutoscaler scales on CPU utilization, not GPU load")
    if facts.compute_capabilities:
        notes.append(f"the plans run only on GPUs of compute capability {', '.join(facts.compute_capabilities)}: schedule the "
                     f"pods on such nodes (e.g. a nodeSelector on GPU feature discovery's nvidia.com/gpu.compute.major/minor)")
    return gpus


def _credentials(location: Any, secret: str) -> tuple[list[EnvVar], list[Volume], list[tuple[str, str, str]],
                                                       list[tuple[str, str]]]:
    """Environment, volumes, secret entries and secret annotations for the location's scheme."""
    env: list[EnvVar] = []
    volumes: list[Volume] = []
    secret_annotations: list[tuple[str, str]] = []
    if location.scheme == "s3":
        env = [EnvVar("AWS_ACCESS_KEY_ID", secret_key="AWS_ACCESS_KEY_ID"),
               EnvVar("AWS_SECRET_ACCESS_KEY", secret_key="AWS_SECRET_ACCESS_KEY"),
               EnvVar("AWS_DEFAULT_REGION", secret_key="AWS_DEFAULT_REGION", optional=True)]
        data = [("AWS_ACCESS_KEY_ID", PLACEHOLDER, ""), ("AWS_SECRET_ACCESS_KEY", PLACEHOLDER, ""),
                ("AWS_DEFAULT_REGION", "us-east-1", "the bucket's region (optional)")]
        if location.endpoint is not None:  # KServe's storage initializer reads the endpoint from the secret
            proto, host, port = location.endpoint
            secret_annotations = [("serving.kserve.io/s3-endpoint", f"{host}:{port}"),
                                  ("serving.kserve.io/s3-usehttps", "1" if proto == "https" else "0")]
    elif location.scheme == "gs":
        env = [EnvVar("GOOGLE_APPLICATION_CREDENTIALS", value=f"{GCS_MOUNT}/{GCS_KEY_FILE}")]
        volumes.append(Volume("storage-credentials", GCS_MOUNT, secret_name=secret))
        data = [(GCS_KEY_FILE, PLACEHOLDER, "the service account key file (JSON); Triton reads it at "
                 f"{GCS_MOUNT}/{GCS_KEY_FILE}")]
    else:
        env = [EnvVar("AZURE_STORAGE_ACCOUNT", value=location.bucket),
               EnvVar("AZURE_STORAGE_KEY", secret_key="AZURE_STORAGE_KEY")]
        data = [("AZURE_STORAGE_KEY", PLACEHOLDER, f"an access key of the storage account {location.bucket}"),
                ("AZURE_STORAGE_ACCESS_KEY", PLACEHOLDER, "the same key, under the name KServe reads")]
    return env, volumes, data, secret_annotations


# --------------------------------------------------------------------------------------------
# Rendering (pure)


def _quote(value: Any) -> str:
    """A YAML double-quoted scalar (JSON's string syntax is YAML's): names such as ``on`` or ``1``
    stay strings."""
    return json.dumps(str(value), ensure_ascii=False)


def _environment() -> Any:
    import jinja2

    folder = resources.files("trtrepo.templates").joinpath("k8s")
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(folder)), undefined=jinja2.StrictUndefined,
                             trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True, autoescape=False)
    env.filters["q"] = _quote
    return env


def render_values(values: ManifestValues) -> dict[str, str]:
    """File name -> YAML text, each file from ``templates/k8s/<file>.j2``."""
    env = _environment()
    return {name: env.get_template(f"{name}.j2").render(v=values).rstrip() + "\n" for name in FILES}


def render_manifests(repo_url: str, facts: RepositoryFacts, options: ManifestOptions) -> dict[str, str]:
    """File name -> YAML text of the manifests (see :func:`manifest_values`; the notes are
    ``manifest_values(...).notes``). Pure."""
    return render_values(manifest_values(repo_url, facts, options))


# --------------------------------------------------------------------------------------------
# Writing


def write_manifests(files: Mapping[str, str], out_dir: str | Path, force: bool = False) -> list[Path]:
    """Write ``files`` into ``out_dir``, each atomically; an existing file is refused (before any
    is written) unless ``force``."""

    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise UsageError(f"-o {out}: not a folder")
    if not force:
        existing = [out / n for n in files if (out / n).exists()]
        if existing:
            more = f" (and {len(existing) - 1} more)" if len(existing) > 1 else ""
            raise OptionError("", f"{existing[0]}: already exists{more} (use {{force}} to overwrite)", others={"force": "force=True"})
    return [atomic_write_text(out / name, text, force=force) for name, text in files.items()]
