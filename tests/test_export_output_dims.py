"""Issue 27 item 5: exported outputs keep the sizes the model knows. A sentence encoder's pooled
output comes out of the legacy exporter as ``[batch, <symbolic>]``; after ``trtrepo export`` it is
``[batch, 12]`` in the ONNX graph and ``dims: [ 12 ]`` in the rendered config.pbtxt, while batch
and the declared sequence axes stay dynamic."""

from __future__ import annotations

import sys
import textwrap

import numpy as np
import onnx
import pytest

from trtrepo.export import probe_feed, static_output_dims
from trtrepo.tritonconfig import parse_config_text

ENCODER = textwrap.dedent("""
    import torch
    from torch import nn

    class Encoder(nn.Module):
        # token embeddings mixed per token, then a masked mean pooled into a normalized 12-d vector
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(50, 24)
            self.mix = nn.Linear(24, 24)
            self.proj = nn.Linear(24, 12)

        def forward(self, input_ids, attention_mask):
            tokens = torch.tanh(self.mix(self.emb(input_ids)))
            m = attention_mask.unsqueeze(-1).to(tokens.dtype)
            pooled = (tokens * m).sum(1) / m.sum(1).clamp(min=1e-9)
            return nn.functional.normalize(self.proj(pooled), dim=-1), tokens

    def build():
        torch.manual_seed(0)
        return Encoder()
""")


@pytest.fixture
def encoder_module(tmp_path, monkeypatch):
    (tmp_path / "dims_encoder.py").write_text(ENCODER)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    yield tmp_path
    sys.modules.pop("dims_encoder", None)


EXPORT_ARGS = ("export", "dims_encoder:build", "--input-shape", "input_ids:7", "--input-shape", "attention_mask:7",
               "--input-dtype", "input_ids:int64", "--input-dtype", "attention_mask:int64",
               "--output-names", "embedding,tokens",
               "--dynamic-axis", "input_ids:1:seq", "--dynamic-axis", "attention_mask:1:seq")


def _dims(value_info) -> list:
    """An ONNX tensor's dims: an int for a fixed size, the name for a symbolic one, None for unknown."""
    return [d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in value_info.type.tensor_type.shape.dim]


def test_pooled_output_is_static_in_onnx_and_config(run_cli, encoder_module):
    out = encoder_module / "enc.onnx"
    r = run_cli(*EXPORT_ARGS, "--dynamic-axis", "tokens:1:seq", "-o", out)
    assert r.exit_code == 0, r.output
    model = onnx.load(str(out))
    onnx.checker.check_model(model, full_check=True)
    outputs = {o.name: _dims(o) for o in model.graph.output}
    # the width the model knows is a number; only batch and the declared sequence axis are symbolic
    assert outputs == {"embedding": ["batch", 12], "tokens": ["batch", "seq", 24]}
    assert {i.name: _dims(i) for i in model.graph.input} == {"input_ids": ["batch", "seq"],
                                                             "attention_mask": ["batch", "seq"]}
    assert "output embedding: float32 [-1, 12]" in r.output

    # ONNX Runtime agrees at other batch and sequence sizes
    from trtrepo.evaluate import make_session

    sess = make_session(str(out))
    feed = {"input_ids": np.arange(20, dtype=np.int64).reshape(5, 4) % 50, "attention_mask": np.ones((5, 4), np.int64)}
    emb, tokens = sess.run(["embedding", "tokens"], feed)
    assert emb.shape == (5, 12) and tokens.shape == (5, 4, 24)

    # the rendered config.pbtxt, parsed as Triton's ModelConfig: dims [ 12 ] (batch implicit)
    repo = encoder_module / "repo"
    r = run_cli("repo", "add", out, "--backend", "onnxruntime", "--repo", repo, "--name", "enc")
    assert r.exit_code == 0, r.output
    config = parse_config_text((repo / "enc" / "config.pbtxt").read_text(), "config.pbtxt")
    assert config.max_batch_size > 0
    assert {t.name: list(t.dims) for t in config.output} == {"embedding": [12], "tokens": [-1, 24]}
    assert {t.name: list(t.dims) for t in config.input} == {"input_ids": [-1], "attention_mask": [-1]}


def test_undeclared_output_axis_that_varies_stays_dynamic(run_cli, encoder_module):
    """Without --dynamic-axis tokens:1 the per-token output's sequence axis still varies with the
    input: it is not fixed to the export sample's length 7."""
    out = encoder_module / "enc.onnx"
    r = run_cli(*EXPORT_ARGS, "-o", out)
    assert r.exit_code == 0, r.output
    outputs = {o.name: _dims(o) for o in onnx.load(str(out)).graph.output}
    assert outputs["embedding"] == ["batch", 12]
    assert outputs["tokens"][0] == "batch" and outputs["tokens"][2] == 24
    assert isinstance(outputs["tokens"][1], str)  # symbolic, not 7
    config_repo = encoder_module / "repo"
    assert run_cli("repo", "add", out, "--backend", "onnxruntime", "--repo", config_repo, "--name", "enc").exit_code == 0
    config = parse_config_text((config_repo / "enc" / "config.pbtxt").read_text(), "config.pbtxt")
    assert {t.name: list(t.dims) for t in config.output} == {"embedding": [12], "tokens": [-1, 24]}


def test_static_output_dims_rule():
    runs = [{"pooled": (2, 384), "tokens": (2, 7, 384), "scores": (2, 7)},
            {"pooled": (1, 384), "tokens": (1, 6, 384), "scores": (1, 6)}]
    declared = {"pooled": {0: "batch"}, "tokens": {0: "batch", 1: "seq"}, "scores": {0: "batch"}}
    assert static_output_dims(runs, declared) == {
        "pooled": {1: 384},
        "tokens": {2: 384},
        "scores": {1: None},  # undeclared but varying: dynamic, never fixed to 7
    }
    # a rank that changes between runs: nothing decided for that output
    assert static_output_dims([{"x": (2, 3)}, {"x": (1, 3, 1)}], {"x": {0: "batch"}}) == {}


def test_probe_feed_resizes_batch_and_declared_axes_only():
    feed = {"ids": np.arange(14).reshape(2, 7), "mask": np.ones((2, 7), np.int64), "img": np.zeros((2, 1, 3), np.float32)}
    axes = {"ids": {0: "batch", 1: "seq"}, "mask": {0: "batch", 1: "seq"}, "img": {0: "batch", 1: "h"}}
    probe = probe_feed(feed, axes)
    assert probe["ids"].shape == (1, 6) and probe["mask"].shape == (1, 6)
    assert probe["img"].shape == (1, 2, 3)  # a size-1 axis grows to 2; the undeclared axis keeps 3
    assert probe["ids"].tolist() == [[0, 1, 2, 3, 4, 5]]  # rows of the sample itself
    assert probe["ids"].dtype == feed["ids"].dtype


@pytest.mark.triton
def test_served_metadata_says_how_wide_the_embedding_is(run_cli, encoder_module, triton_server):
    """The symptom itself: a real tritonserver's model metadata gives the pooled output's width."""
    import tritonclient.http as httpclient

    from trtrepo.repository import add_onnx_model
    from trtrepo.server import find_python_env
    from trtrepo.tritonconfig import ModelOptions

    env = find_python_env()
    if env is None:
        pytest.skip("no numpy<2 environment for the Python backend (run scripts/install_tritonserver.sh)")
    out = encoder_module / "enc.onnx"
    assert run_cli(*EXPORT_ARGS, "--dynamic-axis", "tokens:1:seq", "-o", out).exit_code == 0
    repo = encoder_module / "served"
    add_onnx_model(repo, "enc", out, backend="python", options=ModelOptions(execution_env=str(env)))
    server = triton_server(repo)
    meta = httpclient.InferenceServerClient(server.http_url).get_model_metadata("enc")
    assert {o["name"]: [int(d) for d in o["shape"]] for o in meta["outputs"]} == {"embedding": [-1, 12],
                                                                                   "tokens": [-1, -1, 24]}
