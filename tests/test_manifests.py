"""``trtrepo manifests`` (issue 18 item 2): Kubernetes manifests for a Triton fleet reading a
repository from object storage, validated offline against the Kubernetes schemas that
kubernetes-validate ships, for two Kubernetes versions.

The Deployment has a golden file; after an intended change regenerate it with
``python tests/test_manifests.py --update-golden`` and review the diff; the test itself only compares.
"""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
import yaml

from trtrepo.contracts.location import parse_storage_url
from trtrepo.errors import UsageError
from trtrepo.manifests import (
    FILES,
    ManifestOptions,
    RepositoryFacts,
    facts_from_folder,
    manifest_values,
    render_manifests,
    write_manifests,
)
from trtrepo.server import release_for_tensorrt, release_table

kubernetes_validate = pytest.importorskip("kubernetes_validate", reason="pip install kubernetes-validate (test extra)")

GOLDEN = Path(__file__).parent / "golden" / "k8s-deployment.yaml"
# Two Kubernetes versions whose schemas kubernetes-validate ships (it has v1.25 .. v1.37).
K8S_VERSIONS = ("1.30.0", "1.33.0")
KSERVE_OWN = {"storageUri", "runtimeVersion", "protocolVersion", "storage"}  # PredictorExtensionSpec beside the Container
KSERVE_EXTENSION = {"minReplicas", "maxReplicas", "scaleTarget", "scaleMetric"}  # ComponentExtensionSpec


def golden_inputs() -> tuple[str, RepositoryFacts, ManifestOptions]:
    """Fixed inputs: a plan (TensorRT 10.11, from the release table) beside a Python-backend model, on
    a MinIO endpoint, polled."""
    facts = RepositoryFacts(models=("demo", "demo_plan"), tensorrt_versions=("10.11.0.33",), python_models=("demo",),
                            gpu_models=("demo_plan",), source="model_repository")
    options = ManifestOptions(namespace="models", s3_endpoint="http://minio.storage:9000", model_control_mode="poll",
                              repository_poll_secs=30)
    return "s3://models/triton-repo", facts, options


def docs_of(text: str) -> list[dict]:
    return [d for d in yaml.safe_load_all(text) if d]


def definition_validator(version: str, definition: str):
    """A validator for one definition of the Kubernetes schemas kubernetes-validate ships (strict:
    unknown fields are errors), e.g. io.k8s.api.core.v1.Container."""
    from importlib_resources import files
    from referencing import Registry, Resource

    folder = files("kubernetes_validate").joinpath("kubernetes-json-schema", f"v{version}-local-strict")
    defs = json.loads(folder.joinpath("_definitions.json").read_text())
    registry = Resource.from_contents(defs) @ Registry()
    return jsonschema.Draft202012Validator({"$ref": f"{defs['$id']}#/$defs/{definition}"}, registry=registry)


def validate_kubernetes(files: dict[str, str]) -> dict[str, list[str]]:
    """Every document of every file against the schemas of each of K8S_VERSIONS (strict); the
    InferenceService (a custom resource: kubernetes-validate has no schema for it) by the parts it
    takes from Kubernetes: metadata (ObjectMeta), the predictor's pod fields (PodSpec) and the
    ``triton`` container fields (Container). Returns file -> kinds checked."""
    checked: dict[str, list[str]] = {}
    for name, text in files.items():
        for doc in docs_of(text):
            checked.setdefault(name, []).append(doc["kind"])
            for version in K8S_VERSIONS:
                if doc["kind"] != "InferenceService":
                    assert kubernetes_validate.validate(doc, version, strict=True) == version.rsplit(".", 1)[0]
                    continue
                with pytest.raises(kubernetes_validate.SchemaNotFoundError):
                    kubernetes_validate.validate(doc, version, strict=True)
                assert doc["apiVersion"] == "serving.kserve.io/v1beta1" and set(doc) == {"apiVersion", "kind", "metadata", "spec"}
                definition_validator(version, "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta").validate(doc["metadata"])
                predictor = doc["spec"]["predictor"]
                assert set(doc["spec"]) == {"predictor"}
                pod = {k: v for k, v in predictor.items() if k not in KSERVE_EXTENSION and k != "triton"}
                definition_validator(version, "io.k8s.api.core.v1.PodSpec").validate({**pod, "containers": []})
                container = {k: v for k, v in predictor["triton"].items() if k not in KSERVE_OWN}
                definition_validator(version, "io.k8s.api.core.v1.Container").validate({**container, "name": "kserve-container"})
                assert predictor["scaleMetric"] == "cpu" and 1 <= predictor["minReplicas"] <= predictor["maxReplicas"]
    return checked


def container_of(files: dict[str, str]) -> dict:
    (deployment,) = docs_of(files["deployment.yaml"])
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return container


def inference_service_of(files: dict[str, str]) -> dict:
    return next(d for d in docs_of(files["kserve-inferenceservice.yaml"]) if d["kind"] == "InferenceService")


# --- repositories made with the project's own code -----------------------------------------------


@pytest.fixture(scope="module")
def python_repo(tmp_path_factory, demo_onnx) -> Path:
    from trtrepo.repository import add_onnx_model

    repo = tmp_path_factory.mktemp("manifests") / "model_repository"
    add_onnx_model(repo, "demo", demo_onnx, backend="python")
    return repo


@pytest.fixture(scope="module")
def plan_repo(tmp_path_factory) -> Path:
    from test_repository import write_plan

    from trtrepo.repository import add_plan_model

    tmp = tmp_path_factory.mktemp("plan")
    repo = tmp / "model_repository"
    add_plan_model(repo, "demo_plan", write_plan(tmp, tensorrt_version="10.3.0.26", cc="9.0"))
    return repo


def test_facts_of_local_repositories(python_repo, plan_repo):
    py = facts_from_folder(python_repo)
    assert (py.models, py.python_models, py.gpu_models, py.tensorrt_versions) == (("demo",), ("demo",), (), ())
    assert not py.needs_gpu and py.host_specific == () and py.source == str(python_repo)
    plan = facts_from_folder(plan_repo)
    assert (plan.models, plan.tensorrt_versions, plan.gpu_models, plan.python_models) == (
        ("demo_plan",), ("10.3.0.26",), ("demo_plan",), ())
    assert plan.needs_gpu and plan.compute_capabilities == ("9.0",)


@pytest.mark.parametrize("case", ["python-s3-endpoint", "plan-gs", "plan-azure-own-account"])
def test_every_manifest_passes_the_kubernetes_schemas_of_two_versions(case, python_repo, plan_repo):
    if case == "python-s3-endpoint":
        repo, options = python_repo, ManifestOptions(repository_url="s3://models/triton", s3_endpoint="https://minio.example:9443")
    elif case == "plan-gs":
        repo, options = plan_repo, ManifestOptions(repository_url="gs://bucket/repo", name="fleet", namespace="inference",
                                                   replicas=3, max_replicas=6, model_control_mode="poll")
    else:
        repo, options = plan_repo, ManifestOptions(repository_url="as://acct/models/repo", service_account="ml-reader",
                                                   image="registry.example/triton:custom", gpus=2)
    files = render_manifests(str(repo), facts_from_folder(repo), options)
    assert tuple(files) == FILES
    checked = validate_kubernetes(files)
    assert checked == {"deployment.yaml": ["Deployment"], "service.yaml": ["Service"], "hpa.yaml": ["HorizontalPodAutoscaler"],
                       "secret.example.yaml": ["Secret"],
                       "kserve-inferenceservice.yaml": (["InferenceService"] if options.service_account
                                                        else ["ServiceAccount", "InferenceService"])}


def test_the_schema_check_catches_a_misspelt_field():
    """The validation above has teeth: a field the schema does not know fails it (strict)."""
    files = render_manifests(*golden_inputs())
    (deployment,) = docs_of(files["deployment.yaml"])
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    container["readinesProbe"] = container.pop("readinessProbe")
    with pytest.raises(kubernetes_validate.ValidationError, match="readinesProbe"):
        kubernetes_validate.validate(deployment, K8S_VERSIONS[0], strict=True)
    isvc = inference_service_of(files)
    isvc["spec"]["predictor"]["triton"]["resource"] = {}
    with pytest.raises(jsonschema.ValidationError, match="resource"):
        validate_kubernetes({"kserve-inferenceservice.yaml": yaml.safe_dump(isvc)})


def test_deployment_matches_golden_file():
    text = render_manifests(*golden_inputs())["deployment.yaml"]
    assert GOLDEN.is_file(), f"{GOLDEN} is missing; write it with python tests/test_manifests.py --update-golden"
    assert text == GOLDEN.read_text(), f"{GOLDEN} differs; if intended: python tests/test_manifests.py --update-golden"


def test_deployment_probes_ports_credentials_and_triton_url():
    files = render_manifests(*golden_inputs())
    c = container_of(files)
    assert c["readinessProbe"]["httpGet"] == {"path": "/v2/health/ready", "port": "http"}
    assert c["livenessProbe"]["httpGet"] == {"path": "/v2/health/live", "port": "http"}
    assert c["startupProbe"]["periodSeconds"] * c["startupProbe"]["failureThreshold"] >= 600
    assert [(p["name"], p["containerPort"]) for p in c["ports"]] == [("http", 8000), ("grpc", 8001), ("metrics", 8002)]
    # Triton's form for a custom endpoint, with the port written out (its URL pattern needs it)
    assert "--model-repository=s3://http://minio.storage:9000/models/triton-repo" in c["args"]
    assert c["args"][-2:] == ["--model-control-mode=poll", "--repository-poll-secs=30"]
    refs = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in c["env"]}
    assert set(refs) == {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION"}
    assert {r["name"] for r in refs.values()} == {"triton-storage-credentials"}
    (service,) = docs_of(files["service.yaml"])
    assert [(p["name"], p["port"]) for p in service["spec"]["ports"]] == [("http", 8000), ("grpc", 8001), ("metrics", 8002)]
    (secret,) = docs_of(files["secret.example.yaml"])
    assert set(secret["stringData"]) == {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION"}
    assert secret["stringData"]["AWS_SECRET_ACCESS_KEY"] == "REPLACE_ME" and "EXAMPLE ONLY" in files["secret.example.yaml"]
    assert secret["metadata"]["annotations"] == {"serving.kserve.io/s3-endpoint": "minio.storage:9000",
                                                 "serving.kserve.io/s3-usehttps": "0"}
    isvc = inference_service_of(files)
    # KServe's storage initializer takes the plain URL; the endpoint comes from the secret's annotations
    assert isvc["spec"]["predictor"]["triton"]["storageUri"] == "s3://models/triton-repo"
    assert isvc["spec"]["predictor"]["triton"]["runtimeVersion"] == "25.07-py3"
    (account,) = [d for d in docs_of(files["kserve-inferenceservice.yaml"]) if d["kind"] == "ServiceAccount"]
    assert account["secrets"] == [{"name": "triton-storage-credentials"}]
    assert isvc["spec"]["predictor"]["serviceAccountName"] == account["metadata"]["name"]


def test_gcs_and_azure_credentials():
    facts = RepositoryFacts(models=("m",))
    gs = container_of(render_manifests("gs://b/p", facts, ManifestOptions()))
    assert {"name": "GOOGLE_APPLICATION_CREDENTIALS", "value": "/var/secrets/gcp/gcloud-application-credentials.json"} in gs["env"]
    assert {"name": "storage-credentials", "mountPath": "/var/secrets/gcp", "readOnly": True} in gs["volumeMounts"]
    files = render_manifests("as://acct/cont/prefix", facts, ManifestOptions())
    env = {e["name"]: e for e in container_of(files)["env"]}
    assert env["AZURE_STORAGE_ACCOUNT"]["value"] == "acct"
    assert env["AZURE_STORAGE_KEY"]["valueFrom"]["secretKeyRef"] == {"name": "triton-storage-credentials", "key": "AZURE_STORAGE_KEY"}
    assert "--model-repository=as://acct/cont/prefix" in container_of(files)["args"]
    assert inference_service_of(files)["spec"]["predictor"]["triton"]["storageUri"] == (
        "https://acct.blob.core.windows.net/cont/prefix")


# --- GPU request and image --------------------------------------------------------------------


@pytest.mark.parametrize(("tensorrt", "release"), [("10.11.0.33", "25.07"), ("10.3.0.26", "24.08"), ("10.8.0.43", "25.02")])
def test_plan_gives_one_gpu_and_the_release_of_its_tensorrt(tensorrt, release):
    facts = RepositoryFacts(models=("p",), tensorrt_versions=(tensorrt,), gpu_models=("p",))
    files = render_manifests("s3://models/r", facts, ManifestOptions())
    c = container_of(files)
    assert release_for_tensorrt(tensorrt).release == release
    assert c["image"] == f"nvcr.io/nvidia/tritonserver:{release}-py3"
    assert c["resources"]["limits"]["nvidia.com/gpu"] == "1" == c["resources"]["requests"]["nvidia.com/gpu"]
    assert inference_service_of(files)["spec"]["predictor"]["triton"]["resources"]["limits"]["nvidia.com/gpu"] == "1"
    (deployment,) = docs_of(files["deployment.yaml"])
    assert deployment["metadata"]["annotations"]["trtrepo/tensorrt-version"] == tensorrt


def test_tensorrt_10_13_plan_follows_the_release_table():
    """The table (templates/triton_releases.json) decides: the newest release shipping TensorRT
    10.13 when it lists one, else a usage error naming the version (no image would load the plan)."""
    facts = RepositoryFacts(models=("p",), tensorrt_versions=("10.13.3.9",), gpu_models=("p",))
    rows, _ = release_table()
    matches = sorted((r for r in rows if r.tensorrt.startswith("10.13.")), key=lambda r: tuple(map(int, r.release.split("."))))
    if matches:
        c = container_of(render_manifests("s3://models/r", facts, ManifestOptions()))
        assert c["image"] == f"nvcr.io/nvidia/tritonserver:{matches[-1].release}-py3"
        assert c["resources"]["limits"]["nvidia.com/gpu"] == "1"
    else:
        with pytest.raises(UsageError, match=r"no Triton release in trtrepo's table ships TensorRT 10\.13\.3\.9"):
            render_manifests("s3://models/r", facts, ManifestOptions())
    # an image chosen by hand still gets the GPU
    c = container_of(render_manifests("s3://models/r", facts, ManifestOptions(image="nvcr.io/nvidia/tritonserver:25.09-py3")))
    assert c["image"] == "nvcr.io/nvidia/tritonserver:25.09-py3" and c["resources"]["limits"]["nvidia.com/gpu"] == "1"


def test_no_plans_gives_no_gpu_and_the_newest_release():
    facts = RepositoryFacts(models=("demo",), python_models=("demo",))
    files = render_manifests("s3://models/r", facts, ManifestOptions())
    c = container_of(files)
    newest = max(release_table()[0], key=lambda r: tuple(map(int, r.release.split("."))))
    assert c["image"] == f"nvcr.io/nvidia/tritonserver:{newest.release}-py3"
    assert "nvidia.com/gpu" not in c["resources"]["limits"] and "nvidia.com/gpu" not in c["resources"]["requests"]
    assert "tolerations" not in docs_of(files["deployment.yaml"])[0]["spec"]["template"]["spec"]
    notes = manifest_values("s3://models/r", facts, ManifestOptions()).notes
    assert any("Python-backend models (demo)" in n and "onnxruntime" in n for n in notes)
    # KIND_GPU instance groups need a GPU too; --gpus overrides either way
    gpu = RepositoryFacts(models=("ort",), gpu_models=("ort",))
    assert container_of(render_manifests("s3://models/r", gpu, ManifestOptions()))["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert "nvidia.com/gpu" not in container_of(render_manifests("s3://models/r", gpu, ManifestOptions(gpus=0)))["resources"]["limits"]


# --- errors -----------------------------------------------------------------------------------


def test_plans_of_several_tensorrt_versions_are_refused():
    facts = RepositoryFacts(models=("a", "b"), tensorrt_versions=("10.3.0.26", "10.8.0.43"), source="repo")
    with pytest.raises(UsageError, match=r"^repo: plans were built with several TensorRT versions \(10\.3\.0\.26, 10\.8\.0\.43\)"):
        render_manifests("s3://models/r", facts, ManifestOptions())


@pytest.mark.parametrize(("kw", "message"), [
    ({"max_replicas": 0}, r"^the maximum replicas 0: below the minimum replicas 1$"),
    ({"min_replicas": 0}, r"^the minimum replicas 0: must be at least 1"),
    ({"replicas": 5}, r"^the replicas 5: outside the minimum replicas 1 \.\. the maximum replicas 4$"),
    ({"cpu_request": "3"}, r"^the CPU request 3: more than the CPU limit 2$"),
    ({"memory_limit": "4GB"}, r"^the memory limit 4GB: not a Kubernetes quantity"),
    ({"repository_poll_secs": 5}, r"^the repository poll interval 5: only with the model control mode poll$"),
    ({"name": "Triton"}, r"^the name Triton: must be a DNS-1035 label"),
    ({"s3_endpoint": "minio:9000"}, r"^the S3 endpoint minio:9000: expected http://HOST\[:PORT\]"),
])
def test_bad_options_name_the_option(kw, message):
    with pytest.raises(UsageError, match=message):
        ManifestOptions(**kw)


def test_storage_urls():
    assert parse_storage_url("model_repository", "repo_url") is None
    loc = parse_storage_url("s3://https://minio.example/bucket/a/b", "repo_url")
    assert loc is not None and loc.triton_url() == "s3://https://minio.example:443/bucket/a/b" and loc.kserve_uri() == "s3://bucket/a/b"
    with pytest.raises(UsageError, match=r"^the repository http://x/y: not an object-storage URL Triton reads"):
        parse_storage_url("http://x/y", "repo_url")
    with pytest.raises(UsageError, match=r"^the repository as://acct: expected as://ACCOUNT/CONTAINER"):
        parse_storage_url("as://acct", "repo_url")
    # Triton ignores a custom endpoint when the bucket or prefix falls outside its URL pattern
    with pytest.raises(UsageError, match=r"Triton needs a bucket of \[0-9a-z.-\]"):
        parse_storage_url("s3://bucket/my repo", "repo_url", "http://minio:9000")
    with pytest.raises(UsageError, match=r"^the repository s3://My_Bucket/repo: no valid bucket name"):
        parse_storage_url("s3://My_Bucket/repo", "repo_url")
    # Triton's HOST:PORT form is HTTP; an --s3-endpoint beside an endpoint in the URL must agree
    assert parse_storage_url("s3://minio:9000/b3t/p", "repo_url").triton_url() == "s3://http://minio:9000/b3t/p"
    assert parse_storage_url("s3://minio:9000/b3t/p", "repo_url", "http://minio:9000/").endpoint == ("http", "minio", 9000)
    with pytest.raises(UsageError, match=r"^the S3 endpoint http://minio:9001: the repository .* names another endpoint"):
        parse_storage_url("s3://minio:9000/b3t/p", "repo_url", "http://minio:9001")
    with pytest.raises(UsageError, match=r"^the S3 endpoint http://minio:9000: only for s3:// repositories, not gs://"):
        parse_storage_url("gs://b/p", "repo_url", "http://minio:9000")


def test_remote_facts_are_read_from_s3_only():
    from trtrepo.manifests import repository_facts

    with pytest.raises(UsageError, match=r"^the repository gs://b/p: trtrepo reads s3:// repositories only; read a local copy"):
        repository_facts("gs://b/p")


def test_write_refuses_existing_files_without_force(tmp_path):
    files = render_manifests(*golden_inputs())
    out = tmp_path / "k8s"
    out.mkdir()
    (out / "hpa.yaml").write_text("mine\n")
    with pytest.raises(UsageError, match=rf"^{out / 'hpa.yaml'}: already exists \(use force=True to overwrite\)$"):
        write_manifests(files, out)
    assert sorted(p.name for p in out.iterdir()) == ["hpa.yaml"] and (out / "hpa.yaml").read_text() == "mine\n"
    written = write_manifests(files, out, force=True)
    assert [p.name for p in written] == list(FILES) and (out / "hpa.yaml").read_text() == files["hpa.yaml"]
    assert not [p for p in out.iterdir() if p.name.startswith(".")]  # no temporary file left


# --- the command ------------------------------------------------------------------------------


def test_cli_writes_what_the_renderer_renders(tmp_path, run_cli, python_repo):
    out = tmp_path / "k8s"
    res = run_cli("manifests", python_repo, "--repository-url", "s3://models/triton", "--s3-endpoint", "http://minio:9000",
                  "-o", out, "--json")
    assert res.exit_code == 0, res.output
    summary = json.loads(res.stdout)
    options = ManifestOptions(repository_url="s3://models/triton", s3_endpoint="http://minio:9000")
    expected = render_manifests(str(python_repo), facts_from_folder(python_repo), options)
    assert summary["written"] == [str(out / n) for n in FILES]
    assert {n: (out / n).read_text() for n in FILES} == expected
    assert summary["repository_url"] == "s3://http://minio:9000/models/triton" and summary["gpus"] == 0
    assert summary["models"] == ["demo"] and summary["storage_uri"] == "s3://models/triton"
    assert any("Python-backend models (demo)" in n for n in summary["notes"])
    assert f"wrote {out / 'deployment.yaml'}" in res.stderr  # the human lines go to stderr under --json
    validate_kubernetes(expected)

    again = run_cli("manifests", python_repo, "--repository-url", "s3://models/triton", "-o", out)
    assert again.exit_code == 2 and again.stdout == ""
    assert again.stderr.strip() == f"error: {out / 'deployment.yaml'}: already exists (and 4 more) (use --force to overwrite)"
    assert {n: (out / n).read_text() for n in FILES} == expected  # nothing overwritten
    forced = run_cli("manifests", python_repo, "--repository-url", "s3://models/triton", "-o", out, "--force", "--name", "fleet")
    assert forced.exit_code == 0, forced.output
    assert docs_of((out / "service.yaml").read_text())[0]["metadata"]["name"] == "fleet"


@pytest.mark.parametrize(("extra", "message"), [
    ((), "REPO_URL {repo}: a local folder is not reachable from the cluster; upload it and give --repository-url"),
    (("--repository-url", "/srv/models"), "--repository-url /srv/models: not an object-storage URL"),
    (("--repository-url", "s3://models/r", "--max-replicas", "0"), "--max-replicas 0: below --min-replicas 1"),
    (("--repository-url", "s3://models/r", "-o", "{repo}/k8s"), "-o {repo}/k8s: lies inside REPO_URL {repo}"),
])
def test_cli_usage_errors_exit_2_with_one_line(tmp_path, run_cli, python_repo, extra, message):
    extra = tuple(str(x).format(repo=python_repo) for x in extra)
    out = () if "-o" in extra else ("-o", tmp_path / "k8s")
    res = run_cli("manifests", python_repo, *out, *extra)
    assert res.exit_code == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: " + message.format(repo=python_repo)), res.stderr
    assert not (tmp_path / "k8s").exists() and not (python_repo / "k8s").exists()


def update_golden() -> None:
    """Write the golden Deployment from the current templates (then review the diff)."""
    GOLDEN.parent.mkdir(exist_ok=True)
    GOLDEN.write_text(render_manifests(*golden_inputs())["deployment.yaml"])
    print(f"wrote {GOLDEN}")


if __name__ == "__main__":
    import sys

    if sys.argv[1:] != ["--update-golden"]:
        raise SystemExit("usage: python tests/test_manifests.py --update-golden")
    update_golden()
