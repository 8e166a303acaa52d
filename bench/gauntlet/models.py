"""The gauntlet's RANDOM-WEIGHT models: a small ViT and a small ConvNeXt from ``transformers``.

They are for coverage (do the quantizers handle these architectures, what do they run as
integer kernels, how fast), NOT for accuracy: the weights are random (``torch.manual_seed``,
transformers' own initialisation), so the only accuracy figures that mean anything are
FP32-vs-INT8 agreement (logit cosine, top-1 agreement of near-arbitrary logits).

* :func:`vit` -- ``ViTForImageClassification`` (hidden 192, 4 layers, 3 heads, MLP 768,
  224x224 input, 16x16 patches, 1000 labels; eager attention), wrapped so the ONNX model has TWO
  outputs: ``logits`` [batch, 1000] and ``pooled`` [batch, 192] (the final-LayerNorm CLS token
  the classifier reads): the gauntlet's several-output model.
* :func:`convnext` -- ``ConvNextForImageClassification`` (depths 2-2-2-2, widths
  48-96-192-384, 1000 labels), output ``logits``. ``layer_scale_init_value=1.0`` instead of
  transformers' 1e-6: with 1e-6 every block's residual branch is scaled to nothing, so the
  network would be its stem and downsampling layers and quantizing the blocks could not show.
* :func:`export_onnx` -- ONNX opset 17 (``torch.onnx.export(dynamo=False)``), input ``input``
  [batch, 3, 224, 224] float32 with a dynamic batch axis, checked against PyTorch with ONNX
  Runtime on a batch of 3 (max abs difference recorded in ``meta.json`` beside the model).

Everything is built offline from a config (no hub). Calibration/evaluation data: the vision
half's photograph crops (``vision.py``, ImageNet normalisation; fine for random weights).

    python bench/gauntlet/models.py [--cache /work/gauntlet-cache] [--models vit_random convnext_random]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

DEFAULT_CACHE = Path("/work/gauntlet-cache")
INPUT_NAME = "input"
SIZE = 224
OPSET = 17
SEED = 0

MODELS: dict[str, dict[str, Any]] = {
    "vit_random": {
        "outputs": ["logits", "pooled"],
        "describe": "ViT (transformers ViTForImageClassification: hidden 192, 4 layers, 3 heads, MLP 768, "
                    "patch 16, 224x224, 1000 labels), RANDOM weights; outputs logits + pooled (CLS)",
    },
    "convnext_random": {
        "outputs": ["logits"],
        "describe": "ConvNeXt (transformers ConvNextForImageClassification: depths 2-2-2-2, widths 48-96-192-384, "
                    "1000 labels, layer scale 1.0), RANDOM weights",
    },
}


def vit() -> Any:
    """The random-weight ViT wrapped to return (logits, pooled), eval mode."""
    import torch
    from transformers import ViTConfig, ViTForImageClassification

    torch.manual_seed(SEED)
    config = ViTConfig(hidden_size=192, num_hidden_layers=4, num_attention_heads=3, intermediate_size=768,
                       image_size=SIZE, patch_size=16, num_labels=1000, attn_implementation="eager")
    model = ViTForImageClassification(config).eval()

    class TwoOutputs(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            hidden = self.model.vit(x).last_hidden_state  # after ViT's final LayerNorm
            pooled = hidden[:, 0, :]
            return self.model.classifier(pooled), pooled

    return TwoOutputs().eval()


def convnext() -> Any:
    """The random-weight ConvNeXt returning logits, eval mode."""
    import torch
    from transformers import ConvNextConfig, ConvNextForImageClassification

    torch.manual_seed(SEED)
    config = ConvNextConfig(depths=[2, 2, 2, 2], hidden_sizes=[48, 96, 192, 384], num_labels=1000,
                            image_size=SIZE, layer_scale_init_value=1.0)
    model = ConvNextForImageClassification(config).eval()

    class LogitsOnly(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.model(pixel_values=x).logits

    return LogitsOnly().eval()


BUILDERS = {"vit_random": vit, "convnext_random": convnext}


def export_onnx(name: str, path: str | Path, check_batch: int = 3) -> dict[str, Any]:
    """Export model ``name`` (vit_random|convnext_random) to ``path`` and check it; returns meta."""
    import onnxruntime as ort
    import torch

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    model = BUILDERS[name]()
    outputs = MODELS[name]["outputs"]
    t = time.perf_counter()
    tmp = path.with_name(path.name + ".tmp.onnx")
    dummy = torch.randn(2, 3, SIZE, SIZE)
    with torch.no_grad():
        torch.onnx.export(model, (dummy,), str(tmp), input_names=[INPUT_NAME], output_names=outputs,
                          opset_version=OPSET, dynamo=False, do_constant_folding=True,
                          dynamic_axes={INPUT_NAME: {0: "batch"}, **{o: {0: "batch"} for o in outputs}})
        x = torch.from_numpy(np.random.default_rng(1).standard_normal((check_batch, 3, SIZE, SIZE)).astype(np.float32))
        ref = model(x)
    ref = [ref] if isinstance(ref, torch.Tensor) else list(ref)
    sess = ort.InferenceSession(str(tmp), providers=["CPUExecutionProvider"])
    got = sess.run(outputs, {INPUT_NAME: x.numpy()})
    err = max(float(np.abs(g - r.numpy()).max()) for g, r in zip(got, ref, strict=True))
    scale = max(float(np.abs(r.numpy()).max()) for r in ref)
    if err > 1e-4 + 1e-3 * scale:
        raise RuntimeError(f"{name}: ONNX Runtime differs from PyTorch by {err:.3g} (outputs up to {scale:.3g})")
    tmp.replace(path)
    meta = {"model": name, "describe": MODELS[name]["describe"], "weights": "random (torch.manual_seed(0))",
            "input": INPUT_NAME, "outputs": outputs, "opset": OPSET, "export_s": round(time.perf_counter() - t, 2),
            "ort_vs_torch_max_abs": err, "max_abs_output": scale, "torch": torch.__version__,
            "parameters": sum(p.numel() for p in model.parameters())}
    path.with_name("meta.json").write_text(json.dumps(meta, indent=1) + "\n")
    return meta


def ensure(name: str, cache: str | Path = DEFAULT_CACHE) -> Path:
    """``cache/name/model.onnx``, exported when missing."""
    path = Path(cache) / name / "model.onnx"
    if not path.is_file():
        export_onnx(name, path)
    return path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cache", type=Path, default=DEFAULT_CACHE)
    ap.add_argument("--models", nargs="+", choices=list(MODELS), default=list(MODELS))
    ap.add_argument("--force", action="store_true", help="export again even when the model exists")
    a = ap.parse_args(argv)
    for name in a.models:
        path = a.cache / name / "model.onnx"
        if a.force or not path.is_file():
            meta = export_onnx(name, path)
            print(f"{path}: {meta['parameters'] / 1e6:.2f} M parameters, exported in {meta['export_s']} s, "
                  f"ORT vs PyTorch max abs {meta['ort_vs_torch_max_abs']:.3g}")
        else:
            print(f"{path}: kept")
    return 0


if __name__ == "__main__":
    sys.exit(main())
