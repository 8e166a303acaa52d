from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

from trtrepo.data import collect, open_data
from trtrepo.errors import UsageError
from trtrepo.modelio import ModelIO
from trtrepo.validate.reference import Reference, run_reference


def test_demo_reference_accuracy_and_agreement_with_onnx(demo_onnx):
    io = ModelIO.from_onnx(demo_onnx)
    data = open_data("demo:val", io=io)
    ref = run_reference("demo", data, io, batch_size=64)
    assert ref.device == "cpu" and ref.labels is not None
    logits = ref.outputs["logits"]
    assert logits.shape == (597, 10)
    accuracy = float((logits.argmax(1) == ref.labels).mean())
    assert accuracy > 0.97, accuracy  # the shipped checkpoint: 99.33% on the 597 validation images
    onnx_out = ort.InferenceSession(str(demo_onnx), providers=["CPUExecutionProvider"]).run(None, collect(data))[0]
    np.testing.assert_allclose(onnx_out, logits, rtol=1e-4, atol=1e-4)


def test_reference_batch_size_does_not_change_outputs(demo_onnx):
    io = ModelIO.from_onnx(demo_onnx)
    data = open_data("demo:val", io=io, limit=40, seed=1)
    a = run_reference("demo", data, io, batch_size=1).outputs["logits"]
    b = run_reference("demo", data, io, batch_size=40).outputs["logits"]
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


def test_reference_errors(demo_onnx):
    io = ModelIO.from_onnx(demo_onnx)
    with pytest.raises(UsageError, match="an ONNX file has no PyTorch model"):
        Reference.for_io(str(demo_onnx), io)
    with pytest.raises(UsageError, match="the reference device tpu: expected cpu"):
        Reference.for_io("demo", io, device="tpu")


@pytest.mark.long
@pytest.mark.slow
def test_demo_training_is_deterministic(tmp_path):
    """The regeneration script gives bit-identical weights twice (one epoch each, shipped data kept)."""
    import torch

    from trtrepo.demo import train

    acc = []
    for name in ("a.pt", "b.pt"):
        acc.append(train.main(["--epochs", "1", "--skip-data", "--out", str(tmp_path / name)]))
    a = torch.load(tmp_path / "a.pt", weights_only=True)
    b = torch.load(tmp_path / "b.pt", weights_only=True)
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert acc[0] == acc[1] and acc[0] > 0.2  # above the 10% of chance after one epoch
