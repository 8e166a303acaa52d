"""Repository writer: validation before write, versions, force, rollback, concurrent writers, plans."""

from __future__ import annotations

import json
import multiprocessing
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trtrepo import repository
from trtrepo.contracts.backends import BACKENDS
from trtrepo.contracts.plan import PLAN_METADATA_FORMAT
from trtrepo.errors import UsageError
from trtrepo.modelio import ModelIO, TensorSpec
from trtrepo.repository import PlanTarget, add_model, add_onnx_model, add_plan_model, list_repository, versions_of
from trtrepo.server import container_command, release_for_tensorrt, release_table
from trtrepo.tritonconfig import ModelOptions, check_model_name, config_from_io


def snapshot(root: Path) -> dict[str, bytes]:
    """Every file under root (lock file aside) with its content."""
    if not root.exists():
        return {}
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and p.name != repository.LOCK_NAME}


def simple_io(batch: bool = True) -> ModelIO:
    lead = (-1,) if batch else ()
    return ModelIO(inputs=(TensorSpec("x", "float32", lead + (3,), 0 if batch else None),),
                   outputs=(TensorSpec("y", "float32", lead + (2,), 0 if batch else None),))


# --- names ------------------------------------------------------------------------------------


@pytest.mark.parametrize("bad", ["", "..", "a/b", "a\\b", ".hidden", "-x", "a..b", "x" * 129, "sp ace", "é"])
def test_check_model_name_rejects_illegal_names(bad):
    with pytest.raises(UsageError, match="not a valid Triton model name"):
        check_model_name(bad)


@pytest.mark.parametrize("good", ["demo", "demo_ensemble", "resnet-50.v2", "_x", "9a"])
def test_check_model_name_accepts_legal_names(good):
    assert check_model_name(good) == good


# --- versions, force, layout ------------------------------------------------------------------


def test_add_onnx_model_allocates_new_versions_and_never_overwrites(tmp_path, demo_onnx):
    repo = tmp_path / "repo"
    r1, _ = add_onnx_model(repo, "demo", demo_onnx, labels=[str(i) for i in range(10)])
    r2, _ = add_onnx_model(repo, "demo", demo_onnx)
    assert (r1.version, r2.version) == (1, 2)
    assert (repo / "demo" / "1" / "model.onnx").is_file() and (repo / "demo" / "2" / "model.onnx").is_file()
    assert (repo / "demo" / "labels.txt").read_text().split() == [str(i) for i in range(10)]
    before = snapshot(repo)
    with pytest.raises(UsageError, match=r"version 1 already exists \(use force=True to replace it, or leave the version out"):
        add_onnx_model(repo, "demo", demo_onnx, version=1)
    assert snapshot(repo) == before
    r3, _ = add_onnx_model(repo, "demo", demo_onnx, version=1, force=True, options=ModelOptions(max_batch_size=4))
    assert r3.replaced and r3.version == 1
    assert "max_batch_size: 4" in (repo / "demo" / "config.pbtxt").read_text()
    assert not (repo / repository.STAGING_NAME).exists()


def test_list_repository_shows_models_versions_and_files(tmp_path, demo_onnx):
    repo = tmp_path / "repo"
    add_onnx_model(repo, "demo", demo_onnx, backend="python")
    (repo / "broken").mkdir()
    entries = {e.name: e for e in list_repository(repo)}
    assert entries["demo"].kind == "python" and entries["demo"].versions == {1: ["model.onnx", "model.py"]}
    assert entries["demo"].inputs == ["input"] and entries["demo"].outputs == ["logits"]
    assert "config.pbtxt not found" in entries["broken"].problem


def test_repo_cli_add_and_list(tmp_path, demo_onnx, run_cli):
    repo = tmp_path / "repo"
    r = run_cli("repo", "add", demo_onnx, "--repo", repo, "--name", "demo", "--preferred-batch-size", "4")
    assert r.exit_code == 0, r.output
    assert "added demo version 1" in r.output
    r = run_cli("repo", "list", repo)
    assert r.exit_code == 0 and "demo  [onnxruntime_onnx, max_batch_size 32]" in r.output and "1/  model.onnx" in r.output
    r = run_cli("repo", "add", demo_onnx, "--repo", repo, "--name", "demo", "--preferred-batch-size", "64")
    assert r.exit_code == 2
    assert "dynamic_batching.preferred_batch_size: 64 must be in 1..max_batch_size (32)" in r.output
    r = run_cli("repo", "add", demo_onnx, "--repo", repo, "--name", "../evil")
    assert r.exit_code == 2 and "not a valid Triton model name" in r.output
    assert sorted(p.name for p in repo.iterdir()) == [repository.LOCK_NAME, "demo"]


# --- validation names the field; nothing written ----------------------------------------------


def test_dims_with_batch_axis_in_template_override_are_rejected(tmp_path, demo_onnx):
    tdir = tmp_path / "t"
    tdir.mkdir()
    # A user template that keeps the batch axis in dims: Triton would silently disable batching.
    (tdir / "onnxruntime.pbtxt.j2").write_text(
        'name: {{ m.name | pbstr }}\nplatform: "onnxruntime_onnx"\nmax_batch_size: {{ m.max_batch_size }}\n'
        'input [ { name: "input" data_type: TYPE_FP32 dims: [ -1, 1, 32, 32 ] } ]\n'
        'output [ { name: "logits" data_type: TYPE_FP32 dims: [ 10 ] } ]\n')
    with pytest.raises(UsageError, match=r"demo/config.pbtxt: input\[0\]\.dims: .*dims must omit the batch axis"):
        add_onnx_model(tmp_path / "repo", "demo", demo_onnx, template_dir=tdir)
    assert snapshot(tmp_path / "repo") == {}


def test_wrong_dtype_and_names_against_model_file_are_rejected(tmp_path):
    io = simple_io()
    cfg = config_from_io("m", io, BACKENDS["onnxruntime_onnx"])
    other = ModelIO(inputs=(TensorSpec("x", "int64", (-1, 3)),), outputs=(TensorSpec("z", "float32", (-1, 2)),))
    with pytest.raises(UsageError, match=r"m/config.pbtxt: input\[0\]\.data_type: 'x' is TYPE_FP32 but the model file has TYPE_INT64"):
        add_model(tmp_path / "repo", cfg, {"model.onnx": b"x"}, io=other)
    other = ModelIO(inputs=(TensorSpec("x", "float32", (-1, 3)),), outputs=(TensorSpec("z", "float32", (-1, 2)),))
    with pytest.raises(UsageError, match=r"output: names do not match the model file's outputs \(missing z; not in the model file: y\)"):
        add_model(tmp_path / "repo", cfg, {"model.onnx": b"x"}, io=other)
    assert snapshot(tmp_path / "repo") == {}


def test_model_without_batch_axis_gets_max_batch_size_zero_and_full_dims(tmp_path):
    io = simple_io(batch=False)
    cfg = config_from_io("m", io, BACKENDS["onnxruntime_onnx"])
    assert cfg.max_batch_size == 0 and cfg.inputs[0].dims == (3,) and cfg.dynamic_batching is None
    with pytest.raises(UsageError, match="has no dynamic batch axis"):
        config_from_io("m", io, BACKENDS["onnxruntime_onnx"], ModelOptions(max_batch_size=8))
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array(np.ones((3, 2), np.float32), "w")
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])], initializer=[w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8  # a model ONNX Runtime loads: add_model tries it before writing
    res = add_model(tmp_path / "repo", cfg, {"model.onnx": model.SerializeToString()}, io=io)
    assert "max_batch_size: 0" in res.config_text


def test_tensorrt_plan_rejects_cpu_instances():
    cfg = config_from_io("p", simple_io(), BACKENDS["tensorrt_plan"], ModelOptions(instance_kind="cpu"))
    from trtrepo.tritonconfig import render_config, validate_config_text

    with pytest.raises(UsageError, match=r"instance_group\[0\]\.kind: TensorRT plans run on GPUs only"):
        validate_config_text(render_config(cfg), "p/config.pbtxt")


def test_missing_model_file_is_named(tmp_path):
    cfg = config_from_io("m", simple_io(), BACKENDS["onnxruntime_onnx"])
    with pytest.raises(UsageError, match="the version folder needs model.onnx"):
        add_model(tmp_path / "repo", cfg, {})
    with pytest.raises(UsageError, match=r"nope.onnx: file not found \(for m/model.onnx\)"):
        add_model(tmp_path / "repo", cfg, {"model.onnx": tmp_path / "nope.onnx"})


# --- plans: profiles and metadata -------------------------------------------------------------


def write_plan(tmp_path: Path, tensorrt_version: str = "10.3.0.26", max_batch: int = 16, cc: str = "9.0") -> Path:
    """A plan file (bytes are opaque here) and the build stage's model.plan.json beside it."""
    plan = tmp_path / "model.plan"
    plan.write_bytes(b"not-a-real-engine")
    io = ModelIO(inputs=(TensorSpec("input", "float32", (-1, 1, 32, 32)),), outputs=(TensorSpec("logits", "float32", (-1, 10)),))
    meta = {"format": PLAN_METADATA_FORMAT, "tensorrt_version": tensorrt_version, "gpu": {"name": "NVIDIA H100", "compute_capability": cc},
            "profiles": [{"input": {"min": [1, 1, 32, 32], "opt": [8, 1, 32, 32], "max": [max_batch, 1, 32, 32]}}],
            "io": io.to_dict()}
    (tmp_path / "model.plan.json").write_text(json.dumps(meta))
    return plan


def test_plan_max_batch_size_comes_from_profile_and_cannot_exceed_it(tmp_path):
    plan = write_plan(tmp_path)
    res, cfg = add_plan_model(tmp_path / "repo", "demo_plan", plan)
    assert cfg.max_batch_size == 16 and cfg.instance_groups[0].kind == "KIND_GPU"
    assert sorted(res.files) == ["model.plan", "model.plan.json"]
    before = snapshot(tmp_path / "repo")
    with pytest.raises(UsageError, match=r"max_batch_size: configuration specified max-batch 64 but TensorRT engine only supports max-batch 16"):
        add_plan_model(tmp_path / "repo", "demo_plan", plan, options=ModelOptions(max_batch_size=64))
    assert snapshot(tmp_path / "repo") == before


def test_plan_target_mismatch_warns(tmp_path, caplog):
    plan = write_plan(tmp_path, tensorrt_version="10.3.0.26", cc="8.0")
    res, _ = add_plan_model(tmp_path / "repo", "p", plan, target=PlanTarget("10.8.0.43", "9.0"))
    assert any("TensorRT 10.3.0.26" in w and "10.8.0.43" in w for w in res.warnings)
    assert any("compute capability 8.0" in w for w in res.warnings)
    res, _ = add_plan_model(tmp_path / "repo", "p", plan, target=PlanTarget("10.3.0.26", "8.0"))
    assert res.warnings == []


def test_plan_target_needs_the_exact_tensorrt_version(tmp_path):
    """A plan only loads in the TensorRT version that built it: a patch release differs too (the build check's rule)."""
    plan = write_plan(tmp_path, tensorrt_version="10.3.0.26", cc="8.0")
    res, _ = add_plan_model(tmp_path / "repo", "p", plan, target=PlanTarget("10.3.1.4", "8.0"))
    assert len(res.warnings) == 1 and "TensorRT 10.3.0.26 but the target server has TensorRT 10.3.1.4" in res.warnings[0]


def test_container_command_picks_release_matching_plan_tensorrt(tmp_path):
    plan = write_plan(tmp_path, tensorrt_version="10.3.0.26")
    add_plan_model(tmp_path / "repo", "p", plan)
    cmd, rel, notes = container_command(tmp_path / "repo")
    assert rel.release == "24.08" and "nvcr.io/nvidia/tritonserver:24.08-py3" in cmd
    assert "--model-repository=/models" in cmd and "TensorRT 10.3.0.26" in notes[0]
    rows, source = release_table()
    assert rows and "release-notes" in source
    with pytest.raises(UsageError, match="no Triton release in trtrepo's table ships TensorRT 7.1"):
        release_for_tensorrt("7.1.3")


# --- interrupted writes -----------------------------------------------------------------------


# Interrupted writes: tests/test_commit_protocol.py (every step, exceptions and SIGKILL, real server).


# --- concurrent writers -----------------------------------------------------------------------


def _writer(repo: str, onnx: str, count: int) -> None:
    for _ in range(count):
        add_onnx_model(repo, "demo", onnx, backend="python")


def test_concurrent_writers_get_distinct_versions(tmp_path, demo_onnx):
    repo = tmp_path / "repo"
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_writer, args=(str(repo), str(demo_onnx), 4)) for _ in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    assert [p.exitcode for p in procs] == [0, 0]
    assert versions_of(repo / "demo") == list(range(1, 9))
    for v in range(1, 9):
        assert sorted(f.name for f in (repo / "demo" / str(v)).iterdir()) == ["model.onnx", "model.py"]
        assert (repo / "demo" / str(v) / "model.onnx").read_bytes() == Path(demo_onnx).read_bytes()
    repository.read_config(repo / "demo")
    assert not (repo / repository.STAGING_NAME).exists()


# --- generated input: valid config or a clear error, nothing written on failure ---------------

NAME_CHARS = st.characters(codec="utf-8", categories=("L", "N", "P", "S", "Zs"))
tensor_names = st.one_of(st.from_regex(r"[A-Za-z_][A-Za-z0-9_:./]{0,10}", fullmatch=True), st.text(NAME_CHARS, max_size=12))
dims = st.one_of(st.lists(st.sampled_from([-1, 1, 3, 32]), min_size=1, max_size=3),
                 st.lists(st.integers(min_value=-3, max_value=64), min_size=0, max_size=4))


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    model_name=st.one_of(st.from_regex(r"[A-Za-z0-9_][A-Za-z0-9_.\-]{0,20}", fullmatch=True), st.text(NAME_CHARS, max_size=20)),
    in_name=tensor_names, out_name=tensor_names, in_dims=dims, out_dims=dims,
    batch=st.booleans(), dtype=st.sampled_from(["float32", "int64", "uint8", "float16", "bool"]),
    mbs=st.one_of(st.none(), st.integers(min_value=-2, max_value=64)),
    preferred=st.one_of(st.just([]), st.lists(st.integers(min_value=-1, max_value=80), max_size=3)),
    kind=st.sampled_from(["auto", "cpu", "gpu", "model", "tpu"]),
    backend=st.sampled_from(["onnxruntime_onnx", "python_onnx", "tensorrt_plan"]),
    count=st.one_of(st.just(1), st.integers(min_value=-1, max_value=3)),
)
def test_generated_configs_are_valid_or_fail_clearly(tmp_path_factory, model_name, in_name, out_name, in_dims, out_dims,
                                                      batch, dtype, mbs, preferred, kind, backend, count):
    from trtrepo.tritonconfig import parse_config_text

    repo = tmp_path_factory.mktemp("hyp") / "repo"
    try:
        lead = (-1,) if batch else ()
        io = ModelIO(inputs=(TensorSpec(in_name, dtype, lead + tuple(in_dims), 0 if batch and True else None),),
                     outputs=(TensorSpec(out_name, "float32", lead + tuple(out_dims), 0 if batch else None),))
        options = ModelOptions(max_batch_size=mbs, preferred_batch_sizes=tuple(preferred), instance_kind=kind, instance_count=count)
        cfg = config_from_io(model_name, io, BACKENDS[backend], options)
        filename = {"onnxruntime_onnx": "model.onnx", "python_onnx": "model.py", "tensorrt_plan": "model.plan"}[backend]
        res = add_model(repo, cfg, {filename: b"m"}, io=io)
    except UsageError as exc:
        msg = str(exc)
        assert msg and "\n" not in msg and "Traceback" not in msg
        assert snapshot(repo) == {}
        return
    msg = parse_config_text((repo / model_name / "config.pbtxt").read_text(), "written")
    assert msg.name == model_name and res.version == 1
    assert list(msg.input[0].dims) == list(cfg.inputs[0].dims)
    if msg.max_batch_size > 0:
        assert all(1 <= b <= msg.max_batch_size for b in msg.dynamic_batching.preferred_batch_size)


def test_serve_without_server_prints_container_command(tmp_path, demo_onnx, run_cli, monkeypatch):
    repo = tmp_path / "repo"
    add_onnx_model(repo, "demo", demo_onnx, backend="python", options=ModelOptions(execution_env="/some/venv"))
    monkeypatch.setenv("TRTREPO_TRITONSERVER", str(tmp_path / "no-such-binary"))
    r = run_cli("serve", repo)
    assert r.exit_code == 0, r.output
    assert "tritonserver not found here" in r.output
    assert f"-v {repo.resolve()}:/models nvcr.io/nvidia/tritonserver:" in r.output
    assert "EXECUTION_ENV_PATH" in r.output
    r = run_cli("serve", tmp_path / "missing")
    assert r.exit_code == 2 and "model repository not found" in r.output


def test_preprocess_package_copy_imports_on_its_own(tmp_path):
    """The preprocessing model's copy of trtrepo's data.py must import without trtrepo installed
    (the server's Python has only numpy and Pillow): every module it needs is copied with it."""
    import subprocess
    import sys

    from trtrepo.repository import preprocess_package_files

    for rel, src in preprocess_package_files().items():
        dst = tmp_path / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        dst.write_bytes(src if isinstance(src, bytes) else Path(src).read_bytes())
    code = ("import sys; sys.modules['trtrepo'] = None; "  # trtrepo itself must not be needed
            "from trtrepo_preprocess.data import Preprocess; print(Preprocess.__name__)")
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True,
                          env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(tmp_path)})
    assert proc.returncode == 0 and proc.stdout.strip() == "Preprocess", proc.stderr[-2000:]


def _two_profile_plan(tmp_path: Path) -> Path:
    """A plan whose metadata has two optimization profiles (max batch 16 and 64) and an FP16
    layer list whose names start with "/" (ONNX node names do)."""
    plan = write_plan(tmp_path)
    meta = json.loads((tmp_path / "model.plan.json").read_text())
    meta["profiles"].append({"input": {"min": [1, 1, 32, 32], "opt": [32, 1, 32, 32], "max": [64, 1, 32, 32]}})
    meta["precision"] = {"mode": "int8+fp16", "fp16": {"keep_fp32": ["/features/features.0/Conv"],
                                                       "saved_to": f"{tmp_path}/m.fp16.onnx"}}
    meta["trtexec"] = f"trtexec --onnx={tmp_path}/m.onnx --saveEngine={tmp_path}/model.plan"
    (tmp_path / "model.plan.json").write_text(json.dumps(meta))
    return plan


def test_plan_max_batch_follows_tritons_rule_over_the_selected_profiles(tmp_path):
    """Issue 29 item 1: one owner of Triton's max-batch rule for plans (PlanMetadata.triton_max_batch):
    profile 0 when no instance group selects one; the largest over the selected profiles; an unknown
    profile is an error naming it; the repository's copy of the metadata keeps layer names whole."""
    from trtrepo.contracts.plan import read_plan_metadata

    plan = _two_profile_plan(tmp_path)
    meta = read_plan_metadata(plan)
    assert meta.triton_max_batch() == 16 and meta.triton_max_batch(["1"]) == 64 and meta.triton_max_batch(["0", "1"]) == 64
    assert meta.max_batch_size == 16
    _, cfg = add_plan_model(tmp_path / "repo", "p0", plan)
    assert cfg.max_batch_size == 16
    _, cfg = add_plan_model(tmp_path / "repo", "p1", plan, options=ModelOptions(profiles=("1",)))
    assert cfg.max_batch_size == 64 and cfg.instance_groups[0].profiles == ("1",)
    with pytest.raises(UsageError, match=r"instance_group.profile: the plan has no optimization profile '2' \(has 0, 1\)"):
        add_plan_model(tmp_path / "repo", "p2", plan, options=ModelOptions(profiles=("2",)))
    assert not (tmp_path / "repo" / "p2").exists()
    written = json.loads((tmp_path / "repo" / "p1" / "1" / "model.plan.json").read_text())
    assert written["precision"]["fp16"] == {"keep_fp32": ["/features/features.0/Conv"], "saved_to": "m.fp16.onnx"}
    assert written["trtexec"] == "trtexec --onnx=m.onnx --saveEngine=model.plan"
    assert read_plan_metadata(tmp_path / "repo" / "p1" / "1" / "model.plan").profiles == meta.profiles
