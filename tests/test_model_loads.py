"""A model must load before it lands (issue 39 item 2): ``repo add``, ``deploy`` and ``tune --apply``
try the model file with the runtime that will serve it (the real ONNX Runtime, in a child
process) and refuse, before anything is written, a model it does not load; ``repo check`` names
one already in a repository; a good model beside the refused ones keeps serving on the real
tritonserver. The five models ONNX Runtime cannot load are built here with onnx.helper."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import onnx
import pytest
from conftest import requires_tritonserver
from onnx import TensorProto, helper

from trtrepo import repository
from trtrepo.errors import UsageError
from trtrepo.repository import LoadCheck, try_load
from trtrepo.repository.loads import clean_error


def _model(nodes, *, dtype=TensorProto.FLOAT, initializers=(), opset=13, domains=()):
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", dtype, ["N", 4])],
                              [helper.make_tensor_value_info("y", dtype, ["N", 4])], initializer=list(initializers))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset),
                                                    *(helper.make_opsetid(d, 1) for d in domains)])
    model.ir_version = 8
    return model


def _good():
    return _model([helper.make_node("Relu", ["x"], ["y"])])


def _cycle():
    return _model([helper.make_node("Add", ["x", "b"], ["a"]), helper.make_node("Relu", ["a"], ["b"]),
                   helper.make_node("Identity", ["a"], ["y"])])


def _custom_domain_op():
    return _model([helper.make_node("Mystery", ["x"], ["y"], domain="com.example")], domains=["com.example"])


def _opset_99():
    return _model([helper.make_node("Relu", ["x"], ["y"])], opset=99)


def _huge_initializer_without_data():
    w = TensorProto(name="w", data_type=TensorProto.FLOAT, dims=[2**31, 2**31])  # 16 EiB declared, no bytes
    return _model([helper.make_node("ReduceSum", ["w"], ["r"], keepdims=0), helper.make_node("Add", ["x", "r"], ["y"])],
                  initializers=[w])


def _bfloat16_io():
    return _model([helper.make_node("Relu", ["x"], ["y"])], dtype=TensorProto.BFLOAT16, opset=14)


# name -> (builder, what ONNX Runtime 1.31/1.32 says, a piece of it)
BAD = {
    "cycle": (_cycle, "not acyclic"),
    "custom-domain-op": (_custom_domain_op, "com.example:Mystery"),
    "opset-99": (_opset_99, "official released onnx opset versions"),
    "huge-initializer": (_huge_initializer_without_data, "TensorProto"),
    "bfloat16-io": (_bfloat16_io, "Relu(14)"),
}


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("models")
    out = {}
    for name, (build, _) in {**BAD, "good": (_good, "")}.items():
        out[name] = folder / f"{name}.onnx"
        onnx.save(build(), out[name])
    return out


def _one_line_error(result) -> str:
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    assert "Traceback" not in result.output
    return lines[0]


@pytest.mark.parametrize("bad", sorted(BAD))
def test_repo_add_and_deploy_refuse_a_model_its_runtime_cannot_load_and_write_nothing(models, tmp_path, run_cli, bad):
    repo = tmp_path / "repo"
    for backend in ("onnxruntime", "python"):
        r = run_cli("repo", "add", models[bad], "--repo", repo, "--name", "m", "--backend", backend)
        assert r.exit_code == 2, r.output
        line = _one_line_error(r)
        assert str(models[bad]) in line and "model 'm' not written" in line
        if bad == "bfloat16-io" and backend == "python":  # refused by type before ONNX Runtime is asked
            assert "input 'x' is BF16, which the python backend cannot carry" in line
        else:
            assert "ONNX Runtime" in line and "cannot load it" in line and BAD[bad][1] in line
        assert not repo.exists(), "nothing written, not even the repository folder"
    # deploy --precision fp32 passes an ONNX file through as it is (the ONNX checker refuses the
    # cycle and the initializer without data; ONNX Runtime, before any work, the other three)
    r = run_cli("deploy", models[bad], "--repo", repo, "--precision", "fp32", "--backend", "python")
    assert r.exit_code == 2, r.output
    assert models[bad].name in _one_line_error(r)
    assert not repo.exists()


def test_repo_check_names_a_model_in_the_repository_that_cannot_load(models, tmp_path, run_cli):
    repo = tmp_path / "repo"
    for name, backend in (("good", "python"), ("bad", "python"), ("bad_ort", "onnxruntime")):
        assert run_cli("repo", "add", models["good"], "--repo", repo, "--name", name, "--backend", backend).exit_code == 0
    assert run_cli("repo", "check", repo).exit_code == 0
    shutil.copy(models["custom-domain-op"], repo / "bad" / "1" / "model.onnx")  # written by hand, behind trtrepo's back
    shutil.copy(models["cycle"], repo / "bad_ort" / "1" / "model.onnx")
    r = run_cli("repo", "check", repo)
    assert r.exit_code == 1, r.output
    flagged = [line for line in r.output.splitlines() if line.startswith("not loadable:")]
    assert len(flagged) == 2, r.output
    assert f"{repo / 'bad' / '1' / 'model.onnx'}: ONNX Runtime" in flagged[0] and "com.example:Mystery" in flagged[0]
    assert f"{repo / 'bad_ort' / '1' / 'model.onnx'}: ONNX Runtime" in flagged[1] and "not acyclic" in flagged[1]
    assert "good" not in "".join(flagged)


def test_replace_config_of_tune_apply_refuses_a_model_file_that_no_longer_loads(models, tmp_path, run_cli):
    repo = tmp_path / "repo"
    assert run_cli("repo", "add", models["good"], "--repo", repo, "--name", "m", "--backend", "python").exit_code == 0
    config = repo / "m" / "config.pbtxt"
    before = config.read_text()
    text = before.replace("count: 1", "count: 2")
    assert text != before
    repository.replace_config(repo, "m", text)  # the tuned config of a loadable model is written
    shutil.copy(models["opset-99"], repo / "m" / "1" / "model.onnx")
    with pytest.raises(UsageError, match=r"m/1/model.onnx: ONNX Runtime .* cannot load it: .*opset 28.*; the new config is not written"):
        repository.replace_config(repo, "m", before)
    assert config.read_text() == text


def test_the_check_stops_a_load_that_hangs_or_outgrows_its_memory(models, tmp_path):
    fifo = tmp_path / "fifo.onnx"
    os.mkfifo(fifo)  # ONNX Runtime waits for a writer that never comes
    t0 = time.monotonic()
    result = try_load(LoadCheck(fifo, "onnxruntime", timeout_s=1.0))
    assert result.error == "it did not load within 1 s (the load was stopped)"
    assert time.monotonic() - t0 < 10
    assert try_load(LoadCheck(models["good"], "onnxruntime")).error is None, "a fresh child after the stopped one"
    # 1 GiB of external weights (a sparse file: no disk) under a 256 MiB limit
    w = TensorProto(name="w", data_type=TensorProto.FLOAT, dims=[16384, 16384], data_location=TensorProto.EXTERNAL)
    for key, value in (("location", "w.bin"), ("offset", "0"), ("length", str(16384 * 16384 * 4))):
        w.external_data.add(key=key, value=value)
    big = tmp_path / "big.onnx"
    onnx.save(_model([helper.make_node("ReduceSum", ["w"], ["r"], keepdims=0), helper.make_node("Add", ["x", "r"], ["y"])],
                     initializers=[w]), big)
    with open(tmp_path / "w.bin", "wb") as f:
        f.truncate(16384 * 16384 * 4)
    result = try_load(LoadCheck(big, "onnxruntime", memory=256 << 20))
    assert result.error == "it needs more than 256 MiB of memory to load (the check's limit)"


def test_runtime_errors_become_one_line():
    raw = ("[ONNXRuntimeError] : 1 : FAIL : Load model from /a b/m.onnx failed:/onnxruntime_src/onnxruntime/core/graph/"
           "model_load_utils.h:46 void onnxruntime::model_load_utils::ValidateOpsetForDomain(const std::unordered_map<"
           "std::__cxx11::basic_string<char>, int>&, const onnxruntime::logging::Logger&, bool, const std::string&, int) "
           "ONNX Runtime only *guarantees* support for models stamped with official released onnx opset versions. Opset "
           "99 is under development and support for this is limited. The operator schemas and or other functionality "
           "may change before next ONNX release and in this case ONNX Runtime will not guarantee backward "
           "compatibility.\nCurrent official support for domain ai.onnx is till opset 28.\n")
    assert clean_error(raw) == ("ONNX Runtime only *guarantees* support for models stamped with official released onnx "
                                "opset versions. ... Current official support for domain ai.onnx is till opset 28.")


@requires_tritonserver
@pytest.mark.triton
def test_the_good_model_serves_after_the_bad_ones_were_refused(models, tmp_path, run_cli, triton_server):
    repo = tmp_path / "repo"
    for bad in BAD:
        assert run_cli("repo", "add", models[bad], "--repo", repo, "--name", "m", "--backend", "python").exit_code == 2
    assert run_cli("repo", "add", models["good"], "--repo", repo, "--name", "m", "--backend", "python").exit_code == 0
    assert sorted(p.name for p in (repo / "m").iterdir()) == ["1", "config.pbtxt"]
    server = triton_server(repo)
    assert server.model_ready("m")
