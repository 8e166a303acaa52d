"""The embedded demo: a small residual CNN trained on scikit-learn's ``load_digits``.

Everything needed runs offline: the 1797 8x8 digit images ship in ``digits.npz`` (uint8,
0-255) and the trained weights in ``demo_cnn.pt``; ``python -m trtrepo.demo.train`` regenerates
both (it needs scikit-learn and torch) and prints the validation accuracy.

Data splits (deterministic): a fixed permutation with seed 0 puts 1200 images in ``train`` and
597 in ``val``. ``demo:calib`` holds 2048 calibration samples drawn from the training images
only (the 1200 images, then copies shifted by one pixel), ``demo:val`` the validation images
with labels. Images become tensors through :data:`PREPROCESS` (gray, bilinear resize to 32x32,
scale to [0,1], normalise with mean 0.5 / std 0.5, NCHW float32), the same spec a user would
save for an image folder, so a folder of the digits as PNG files yields identical tensors.
"""

from __future__ import annotations

from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from ..contracts.builtin import BuiltinModel
from ..data import ArraySource, Preprocess
from ..errors import UsageError
from ..export import InputShape

NAME = "demo"
INPUT_NAME = "input"
OUTPUT_NAME = "logits"
NUM_CLASSES = 10
IMAGE_SIZE = 32
TRAIN_COUNT = 1200
CALIB_COUNT = 2048
SPLITS = ("calib", "train", "val")

FACTORY = "trtrepo.demo:build_model"


def _preprocess() -> Any:
    return Preprocess(
        resize=(IMAGE_SIZE, IMAGE_SIZE),
        interpolation="bilinear",
        color="gray",
        scale=1.0 / 255.0,
        mean=(0.5,),
        std=(0.5,),
        layout="NCHW",
        dtype="float32",
        input_name=INPUT_NAME,
    )


def package_file(name: str) -> Path:
    return Path(str(resources.files(__name__).joinpath(name)))


def weights_path() -> Path:
    return package_file("demo_cnn.pt")


@lru_cache(maxsize=1)
def raw_digits() -> tuple[np.ndarray, np.ndarray]:
    """(images uint8 [1797, 8, 8] in 0..255, labels int64 [1797])."""
    with np.load(package_file("digits.npz"), allow_pickle=False) as f:
        return f["images"], f["labels"].astype(np.int64)


def split_indices() -> dict[str, np.ndarray]:
    images, _ = raw_digits()
    perm = np.random.default_rng(0).permutation(len(images))
    return {"train": np.sort(perm[:TRAIN_COUNT]), "val": np.sort(perm[TRAIN_COUNT:])}


def raw_split(split: str) -> tuple[np.ndarray, np.ndarray]:
    """Raw uint8 images and labels of a split (calib = train images plus shifted copies)."""
    images, labels = raw_digits()
    idx = split_indices()
    if split in ("train", "val"):
        return images[idx[split]], labels[idx[split]]
    if split != "calib":
        raise UsageError(f"demo data has no split '{split}' (splits: {', '.join(SPLITS)})")
    base, base_labels = images[idx["train"]], labels[idx["train"]]
    rng = np.random.default_rng(1)
    extra = CALIB_COUNT - len(base)
    pick = rng.choice(len(base), size=extra, replace=False)
    shifts = rng.integers(-1, 2, size=(extra, 2))
    shifted = np.stack([np.roll(base[i], tuple(s), axis=(0, 1)) for i, s in zip(pick, shifts, strict=True)])
    return np.concatenate([base, shifted]), np.concatenate([base_labels, base_labels[pick]])


def to_tensors(images: np.ndarray) -> np.ndarray:
    """uint8 8x8 images -> float32 [N, 1, 32, 32] through the demo preprocessing."""
    from PIL import Image

    pre = _preprocess()
    return np.stack([pre.apply(Image.fromarray(img, mode="L")) for img in images])


@lru_cache(maxsize=4)
def split_tensors(split: str) -> tuple[np.ndarray, np.ndarray]:
    images, labels = raw_split(split)
    return to_tensors(images), labels


def open_split(split: str) -> Any:
    """The demo data of ``split`` (``demo:SPLIT``) as an ArraySource with labels."""

    if split not in SPLITS:
        raise UsageError(f"demo:{split}: demo data has no split '{split}' (splits: {', '.join(SPLITS)})")
    x, y = split_tensors(split)
    return ArraySource(f"demo:{split}", {INPUT_NAME: x}, y)


def export_inputs() -> list[Any]:
    return [InputShape(INPUT_NAME, (1, IMAGE_SIZE, IMAGE_SIZE))]


def preprocess() -> Any:
    """The demo's preprocessing spec (what ``trtrepo`` saves beside a deployed demo model)."""
    return _preprocess()


def build_model(weights: bool = True) -> Any:
    """The demo CNN (torch ``nn.Module`` in eval mode), with the shipped weights by default."""
    import torch

    from .model import ResidualCNN  # noqa: PLC0415  # deferred: demo.model imports torch (heavy optional dependency)

    model = ResidualCNN(num_classes=NUM_CLASSES)
    if weights:
        state = torch.load(weights_path(), map_location="cpu", weights_only=True)
        model.load_state_dict(state)
    return model.eval()


BUILTIN = BuiltinModel(
    name=NAME,
    build_model=build_model,
    inputs=export_inputs,
    output_names=(OUTPUT_NAME,),
    open_data=open_split,
    class_labels=tuple(str(i) for i in range(NUM_CLASSES)),
    preprocess=preprocess,
)
