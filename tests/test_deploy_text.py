"""``trtrepo deploy demo-text`` (issue 8): an INT8 repository with two int64 inputs and dynamic
batch and sequence axes that the real CPU tritonserver loads (Python-backend variant) and answers
variable-length requests with what ONNX Runtime gives; the TensorRT build step's shape profiles
from the data (unit-tested: no TensorRT here)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from trtrepo.contracts.profile import BatchProfile
from trtrepo.data import DataOptions
from trtrepo.deploy import DeployOptions, build_options
from trtrepo.errors import UsageError
from trtrepo.evaluate import make_session
from trtrepo.modelio import ModelIO, TensorSpec
from trtrepo.quantize import QuantizeSettings


def text_io() -> ModelIO:
    """What the demo-text export declares (checked against the real export in test_export)."""
    specs = [TensorSpec("input_ids", "int64", (-1, -1), 0, ("batch", "sequence")),
             TensorSpec("attention_mask", "int64", (-1, -1), 0, ("batch", "sequence"))]
    outs = [TensorSpec("logits", "float32", (-1, 4), 0), TensorSpec("embedding", "float32", (-1, 64), 0)]
    return ModelIO(inputs=tuple(specs), outputs=tuple(outs))


def test_profile_from_data_uses_min_median_max_of_the_sequence_axis():
    from trtrepo.data import open_data

    io = text_io()
    shapes = dict(BatchProfile.for_deploy(None).with_data_shapes(io, open_data("demo-text:calib", io=io)).shapes)
    assert set(shapes) == {"input_ids", "attention_mask"}
    r = shapes["input_ids"]
    assert (r.min, r.opt, r.max) == ((1, 8), (8, 24), (32, 32))  # lengths 8..32 padded to multiples of 8
    assert shapes["attention_mask"] == r


def test_build_options_for_deploy_pass_profiles_and_accept_explicit_shapes():
    from trtrepo.data import open_data
    from trtrepo.engine import profile_shapes
    from trtrepo.tritonconfig import ModelOptions

    io = text_io()
    opts = DeployOptions(source="demo-text", model=ModelOptions(max_batch_size=16))
    b = build_options(opts, io, open_data("demo-text:calib", io=io))
    assert (b.min_batch, b.opt_batch, b.max_batch) == (1, 8, 16)
    prof = profile_shapes(io, b)  # what the TensorRT builder gets: valid for both inputs
    assert prof["input_ids"].max == (16, 32) and prof["attention_mask"].min[0] == 1
    explicit = build_options(DeployOptions(source="demo-text", shapes=("input_ids:1x8,8x64,16x128",),
                                           model=ModelOptions(max_batch_size=16)), io)
    assert profile_shapes(io, explicit)["attention_mask"].max == (16, 128)  # the shared axis follows
    with pytest.raises(UsageError, match="the shape range 'input_ids:1x8,8x4,32x32'"):
        build_options(DeployOptions(source="demo-text", shapes=("input_ids:1x8,8x4,32x32",)), io)
    # without data or --shape the builder asks for the range, naming the input
    with pytest.raises(UsageError, match="input_ids.*give it with the shape range input_ids:MIN,OPT,MAX"):
        profile_shapes(io, build_options(DeployOptions(source="demo-text"), io))


@pytest.fixture(scope="module")
def text_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from trtrepo.deploy import deploy

    folder = tmp_path_factory.mktemp("text_repo")
    report = deploy(DeployOptions(source="demo-text", backend="python", repo=str(folder / "repo"),
                                  workdir=str(folder / "work"), data=DataOptions("", limit=256),
                                  int8=QuantizeSettings(metric_output="embedding", target_from_backend=True)))
    assert [m.precision for m in report.models] == ["int8"]
    assert any(s.step == "int8" and s.status == "done" and "chosen on embedding" in s.detail for s in report.steps)
    return folder


def test_deployed_config_has_dynamic_sequence_dims_and_two_int64_inputs(text_repo):
    text = (text_repo / "repo" / "demo_text" / "config.pbtxt").read_text()
    assert 'backend: "python"' in text and "max_batch_size: 32" in text
    for name in ("input_ids", "attention_mask"):
        block = text.split(f'name: "{name}"', 1)[1].split("}", 1)[0]
        assert "TYPE_INT64" in block and "dims: [ -1 ]" in block  # batch implicit (-1), sequence -1


@pytest.mark.slow
def test_real_server_answers_variable_length_requests_like_onnxruntime(text_repo, triton_server):
    import tritonclient.http as httpclient

    from trtrepo.data import iter_batches, open_data

    server = triton_server(text_repo / "repo")
    client = httpclient.InferenceServerClient(server.http_url)
    assert client.is_model_ready("demo_text")
    sess = make_session(text_repo / "work" / "model.int8.onnx")  # the server's session options
    source = open_data("demo-text:val", limit=96, seed=1)
    seen_lengths = set()
    for batch in iter_batches(source, 7):  # odd batch size: partial batches, several lengths
        ids, mask = batch.inputs["input_ids"], batch.inputs["attention_mask"]
        seen_lengths.add(ids.shape[1])
        inputs = []
        for name, arr in (("input_ids", ids), ("attention_mask", mask)):
            inp = httpclient.InferInput(name, list(arr.shape), "INT64")
            inp.set_data_from_numpy(arr)
            inputs.append(inp)
        res = client.infer("demo_text", inputs, outputs=[httpclient.InferRequestedOutput("logits"),
                                                         httpclient.InferRequestedOutput("embedding")])
        logits, emb = res.as_numpy("logits"), res.as_numpy("embedding")
        assert logits.shape == (len(ids), 4) and emb.shape == (len(ids), 64)
        ref_logits, ref_emb = sess.run(["logits", "embedding"], {"input_ids": ids, "attention_mask": mask})
        np.testing.assert_allclose(emb, ref_emb, rtol=1e-4, atol=1e-4)
        assert np.array_equal(logits.argmax(1), ref_logits.argmax(1))
    assert len(seen_lengths) >= 3, seen_lengths
