"""Regenerate the demo's data file and checkpoint: ``python -m trtrepo.demo.train``.

Needs scikit-learn (for ``load_digits``, bundled with it, no download) and torch. Training is
deterministic on the CPU (fixed seeds, deterministic algorithms, one thread) and takes under a
minute on two cores. Prints the FP32 validation accuracy.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

from . import build_model, package_file, raw_digits, split_tensors, weights_path


def write_digits(path: Path) -> None:
    from sklearn.datasets import load_digits

    d = load_digits()
    images = np.rint(d.images * (255.0 / 16.0)).clip(0, 255).astype(np.uint8)
    np.savez_compressed(path, images=images, labels=d.target.astype(np.int64))


def main(argv: list[str] | None = None) -> float:
    import torch
    from torch import nn

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--epochs", type=int, default=12)
    parser.add_argument("--out", type=Path, default=weights_path())
    parser.add_argument("--skip-data", action="store_true", help="keep the existing digits.npz")
    args = parser.parse_args(argv)

    if not args.skip_data:
        write_digits(package_file("digits.npz"))
        raw_digits.cache_clear()
        split_tensors.cache_clear()
    torch.manual_seed(0)
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)

    x_train, y_train = split_tensors("calib")  # train images plus shifted copies: augmentation
    x_val, y_val = split_tensors("val")
    model = build_model(weights=False).train()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=1e-4)
    steps = args.epochs * ((len(x_train) + 63) // 64)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=3e-3, total_steps=steps)
    loss_fn = nn.CrossEntropyLoss()
    xt, yt = torch.from_numpy(x_train), torch.from_numpy(y_train)
    gen = torch.Generator().manual_seed(0)
    start = time.perf_counter()
    for epoch in range(args.epochs):
        perm = torch.randperm(len(xt), generator=gen)
        total = 0.0
        for i in range(0, len(xt), 64):
            idx = perm[i : i + 64]
            opt.zero_grad()
            loss = loss_fn(model(xt[idx]), yt[idx])
            loss.backward()
            opt.step()
            sched.step()
            total += float(loss) * len(idx)
        print(f"epoch {epoch + 1}/{args.epochs} loss {total / len(xt):.4f}")
    model.eval()
    with torch.no_grad():
        pred = model(torch.from_numpy(x_val)).argmax(1).numpy()
    acc = float((pred == y_val).mean())
    torch.save(model.state_dict(), args.out)
    print(f"trained in {time.perf_counter() - start:.1f}s; FP32 validation accuracy {acc * 100:.2f}% ({len(y_val)} images)")
    return acc


if __name__ == "__main__":
    main()
