from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

from trtrepo.errors import TrtrepoError, UsageError
from trtrepo.export import InputShape, export_onnx, load_torch_model, parse_input_shape, resolve_source
from trtrepo.modelio import ModelIO


def _ort(path, feed):
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feed)


def _check_against_torch(model, path, feed):
    with torch.no_grad():
        expected = model(*[torch.from_numpy(v) for v in feed.values()]).numpy()
    got = _ort(path, feed)[0]
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)


def test_export_demo_has_dynamic_batch_and_matches_torch(tmp_path):
    res = export_onnx("demo", tmp_path / "demo.onnx")
    assert res.max_abs_error is not None and res.max_abs_error < 1e-4
    io = ModelIO.from_onnx(res.path)
    assert io.has_batch_axis and io.inputs[0].shape == (-1, 1, 32, 32) and io.outputs[0].name == "logits"
    model = onnx.load(str(res.path))
    assert model.opset_import[0].version == 17
    x = np.random.default_rng(5).standard_normal((7, 1, 32, 32)).astype(np.float32)
    _check_against_torch(load_torch_model("demo"), res.path, {"input": x})


def test_export_chosen_opset_and_names(tmp_path):
    res = export_onnx("demo", tmp_path / "d.onnx", opset=13, output_names=["scores"])
    m = onnx.load(str(res.path))
    assert m.opset_import[0].version == 13
    assert [o.name for o in m.graph.output] == ["scores"]
    with pytest.raises(UsageError, match="opset 13 or newer"):
        export_onnx("demo", tmp_path / "e.onnx", opset=11)


def test_onnx_passthrough_is_checked(tmp_path, demo_onnx):
    res = export_onnx(str(demo_onnx), tmp_path / "copy.onnx")
    assert res.path.read_bytes() and ModelIO.from_onnx(res.path) == ModelIO.from_onnx(demo_onnx)
    bad = onnx.load(str(demo_onnx))
    bad.graph.node[0].input[0] = "does_not_exist"
    onnx.save(bad, str(tmp_path / "bad.onnx"))
    with pytest.raises(UsageError, match="bad.onnx: onnx.checker rejected"):
        export_onnx(str(tmp_path / "bad.onnx"), tmp_path / "out.onnx")
    assert not (tmp_path / "out.onnx").exists()


def test_torchscript_source(tmp_path):
    model = load_torch_model("demo")
    ts = torch.jit.trace(model, torch.zeros(1, 1, 32, 32))
    ts.save(str(tmp_path / "demo.ts"))
    res = export_onnx(str(tmp_path / "demo.ts"), tmp_path / "ts.onnx", inputs=[InputShape("image", (1, 32, 32))])
    assert ModelIO.from_onnx(res.path).input_names == ["image"]
    x = np.random.default_rng(1).standard_normal((4, 1, 32, 32)).astype(np.float32)
    _check_against_torch(model, res.path, {"image": x})


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    (tmp_path / "usermodels.py").write_text(textwrap.dedent("""
        import torch
        from torch import nn

        class TwoInputs(nn.Module):
            def __init__(self):
                super().__init__()
                self.emb = nn.Embedding(50, 8)
                self.proj = nn.Linear(8, 4)
            def forward(self, ids, mask):
                h = self.emb(ids) * mask.unsqueeze(-1).float()
                return self.proj(h.sum(1) / mask.sum(1, keepdim=True).clamp(min=1).float())

        def small():
            torch.manual_seed(0)
            return nn.Sequential(nn.Flatten(), nn.Linear(12, 5), nn.ReLU(), nn.Linear(5, 3))

        def two_inputs():
            torch.manual_seed(0)
            return TwoInputs()

        def not_a_module():
            return 42
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    sys.modules.pop("usermodels", None)


def test_entry_point_with_state_dict(tmp_path, user_module):
    torch.manual_seed(123)
    trained = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(12, 5), torch.nn.ReLU(), torch.nn.Linear(5, 3))
    torch.save(trained.state_dict(), tmp_path / "w.pt")
    res = export_onnx("usermodels:small", tmp_path / "small.onnx", weights=tmp_path / "w.pt",
                      inputs=[InputShape("x", (3, 4))])
    x = np.random.default_rng(2).standard_normal((6, 3, 4)).astype(np.float32)
    _check_against_torch(trained.eval(), res.path, {"x": x})  # the weights were applied


def test_entry_point_several_inputs_and_dynamic_sequence(tmp_path, user_module):
    res = export_onnx("usermodels:two_inputs", tmp_path / "two.onnx",
                      inputs=[InputShape("input_ids", (6,), "int64"), InputShape("attention_mask", (6,), "int64")],
                      dynamic_axes={"input_ids": {1: "sequence"}, "attention_mask": {1: "sequence"}})
    io = ModelIO.from_onnx(res.path)
    assert io.input_names == ["input_ids", "attention_mask"]
    assert io.inputs[0].shape == (-1, -1) and io.inputs[0].dim_names == ("batch", "sequence")
    feed = {"input_ids": np.arange(20).reshape(2, 10) % 50, "attention_mask": np.ones((2, 10), np.int64)}
    _check_against_torch(load_torch_model("usermodels:two_inputs"), res.path, feed)


def test_entry_point_errors(tmp_path, user_module):
    with pytest.raises(UsageError, match="cannot import module 'nosuchpkg_abc.models'.*No module named"):
        export_onnx("nosuchpkg_abc.models:build", tmp_path / "x.onnx", inputs=[InputShape("x", (3,))])
    with pytest.raises(UsageError, match="returned a int, not a torch.nn.Module"):
        export_onnx("usermodels:not_a_module", tmp_path / "x.onnx", inputs=[InputShape("x", (3,))])
    with pytest.raises(UsageError, match="give the input shape"):
        export_onnx("usermodels:small", tmp_path / "x.onnx")
    with pytest.raises(UsageError, match="does not run on inputs x:7"):
        export_onnx("usermodels:small", tmp_path / "x.onnx", inputs=[InputShape("x", (7,))])
    torch.save({"bogus": torch.zeros(1)}, tmp_path / "wrong.pt")
    with pytest.raises(UsageError, match="wrong.pt: state dict does not fit the model"):
        export_onnx("usermodels:small", tmp_path / "x.onnx", weights=tmp_path / "wrong.pt", inputs=[InputShape("x", (3, 4))])
    assert not (tmp_path / "x.onnx").exists()


def test_resolve_source_kinds(tmp_path):
    (tmp_path / "m.onnx").write_bytes(b"")
    (tmp_path / "w.pth").write_bytes(b"")
    assert resolve_source("demo").kind == "demo"
    assert resolve_source(str(tmp_path / "m.onnx")).kind == "onnx"
    assert resolve_source("pkg.mod:make").kind == "entry_point"
    assert resolve_source("resnet18", tmp_path / "w.pth").kind == "torchvision"
    with pytest.raises(UsageError, match="needs a local weights file"):
        resolve_source("resnet18")
    with pytest.raises(UsageError, match="missing.onnx: ONNX file not found"):
        resolve_source(str(tmp_path / "missing.onnx"))
    with pytest.raises(UsageError, match="nope.pth: weights file not found"):
        resolve_source("resnet18", tmp_path / "nope.pth")
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(UsageError, match="unsupported model file type '.txt'"):
        resolve_source(str(tmp_path / "notes.txt"))


def test_torchscript_error_on_state_dict(tmp_path):
    torch.save({"a": torch.zeros(2)}, tmp_path / "state.pt")
    with pytest.raises(UsageError, match="state.pt: not a TorchScript file"):
        export_onnx(str(tmp_path / "state.pt"), tmp_path / "o.onnx", inputs=[InputShape("x", (2,))])


def test_verification_catches_mismatch(tmp_path, user_module, monkeypatch):
    """A model whose ONNX export differs from PyTorch (train-mode dropout) is refused."""
    (user_module / "noisy.py").write_text(textwrap.dedent("""
        import torch
        from torch import nn
        class Noisy(nn.Module):
            def forward(self, x):
                return x + torch.rand_like(x)
        def make():
            return Noisy()
    """))
    with pytest.raises(TrtrepoError, match="differs from PyTorch"):
        export_onnx("noisy:make", tmp_path / "n.onnx", inputs=[InputShape("x", (4,))])
    assert not (tmp_path / "n.onnx").exists()
    sys.modules.pop("noisy", None)


def test_parse_input_shape():
    assert parse_input_shape("3x224x224") == (None, (3, 224, 224))
    assert parse_input_shape("ids:128") == ("ids", (128,))
    with pytest.raises(UsageError, match="the input shape '3xax4': expected dims like 3x224x224"):
        parse_input_shape("3xax4")


@pytest.mark.long
@pytest.mark.torchvision
def test_torchvision_architecture(tmp_path):
    """torchvision does not import beside the torch 2.13 CPU wheel; .ci/run builds a second venv
    (torch 2.14.1 + torchvision 0.29.1 from this machine's disk) and names its interpreter in
    TRTREPO_TORCHVISION_PYTHON, where this test then runs in a subprocess (15 s: in the long tier,
    with the torchvision deploy test in test_byom.py)."""
    try:
        import torchvision as tv
    except Exception:
        other = os.environ.get("TRTREPO_TORCHVISION_PYTHON")
        if not other:
            pytest.skip("torchvision does not import beside torch 2.13 CPU and TRTREPO_TORCHVISION_PYTHON is not set")
        code = f"import sys, pytest; sys.exit(pytest.main(['-q', '-p', 'no:cacheprovider', '-m', 'torchvision', {__file__!r} + '::test_torchvision_architecture']))"
        env = {**os.environ, "TRTREPO_TORCHVISION_PYTHON": "", "PYTHONPATH": str(Path(__file__).parents[1])}
        proc = subprocess.run([other, "-c", code], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=600)
        assert proc.returncode == 0 and " passed" in proc.stdout, proc.stdout[-3000:] + proc.stderr[-3000:]
        return
    torch.manual_seed(0)
    model = tv.models.get_model("resnet18", weights=None, num_classes=1000).eval()
    torch.save(model.state_dict(), tmp_path / "r18.pth")
    res = export_onnx("resnet18", tmp_path / "r18.onnx", weights=tmp_path / "r18.pth", inputs=[InputShape("input", (3, 64, 64))])
    x = np.random.default_rng(0).standard_normal((2, 3, 64, 64)).astype(np.float32)
    _check_against_torch(model, res.path, {"input": x})
    with pytest.raises(UsageError, match="'resnet_nope' is not a torchvision architecture"):
        export_onnx("resnet_nope", tmp_path / "x.onnx", weights=tmp_path / "r18.pth", inputs=[InputShape("input", (3, 8, 8))])


def test_demo_text_exports_two_dynamic_axes_and_several_inputs(tmp_path):
    from trtrepo.data import iter_batches, open_data

    res = export_onnx("demo-text", tmp_path / "text.onnx")
    io = ModelIO.from_onnx(res.path)
    assert io.input_names == ["input_ids", "attention_mask"] and io.output_names == ["logits", "embedding"]
    assert all(t.shape == (-1, -1) and t.dim_names == ("batch", "sequence") for t in io.inputs)
    sess = ort.InferenceSession(str(res.path), providers=["CPUExecutionProvider"])
    data = open_data("demo-text:val", io=io)
    correct = 0
    lengths = set()
    for batch in iter_batches(data, 64, io):
        lengths.add(batch.inputs["input_ids"].shape[1])
        correct += int((sess.run(["logits"], batch.inputs)[0].argmax(1) == batch.labels).sum())
    assert lengths == {8, 16, 24, 32}  # variable sequence lengths through one model
    assert correct / len(data) > 0.9  # shipped weights: 94.53 % on the 512 validation sequences
