"""How much top-1 agreement with FP32 can INT8 keep on the MobileNetV2 photo crops? (issue 13)

The acceptance list asks for >= 99 % top-1 agreement with FP32 on the evaluation crops. This
bench measures what the *weights alone* cost, before any activation is quantized, with the same
BatchNorm folding the ONNX export does and the same weight quantization every tool here uses
(symmetric per-output-channel, round to nearest, amax = max |w|): every activation stays FP32, so
the figures are upper bounds for any INT8 model that rounds its weights to nearest (trtrepo, ONNX
Runtime ``quantize_static``, TensorRT's implicit and explicit INT8).

Rows: the FP32 model's margins on the crops (how many are near-ties), each layer group's weights
alone in INT8, all weights at 8, 10 and 12 bits, and FP16 weights as a noise floor. Run in
PyTorch (CPU), fake quantization on the folded weights; the evaluation crops are the gauntlet's.

    python bench/gauntlet/ceiling.py [--eval 500] [--update-docs docs/benchmarks.md]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))
os.environ.setdefault("TRTREPO_GAUNTLET_CACHE", "/work/gauntlet-cache")

SECTION = "## MobileNetV2: the agreement INT8 weights allow (issue 13)"
GROUPS = ("first", "depthwise", "pw_expand", "pw_project", "last", "classifier")


def folded_model():
    """The trained MobileNetV2 with every BatchNorm folded into the conv before it (as the ONNX
    export does), in eval mode."""
    import torch
    import vision
    from torch import nn

    model = vision.mobilenet_v2(pretrained=True)

    def fold(parent: nn.Module) -> None:
        for child in parent.children():
            fold(child)
        kids = list(parent.named_children())
        for (n1, a), (n2, b) in zip(kids, kids[1:], strict=False):
            if isinstance(a, nn.Conv2d) and isinstance(b, nn.BatchNorm2d):
                s = b.weight / torch.sqrt(b.running_var + b.eps)
                conv = nn.Conv2d(a.in_channels, a.out_channels, a.kernel_size, a.stride, a.padding,
                                 groups=a.groups, bias=True)
                conv.weight.data = a.weight.data * s[:, None, None, None]
                conv.bias.data = b.bias - b.running_mean * s
                setattr(parent, n1, conv)
                setattr(parent, n2, nn.Identity())

    with torch.no_grad():
        fold(model)
    return model.eval()


def layer_groups(model) -> list[tuple[object, str]]:
    """(layer, group) for every Conv2d / Linear in execution order."""
    from torch import nn

    layers = [m for m in model.modules() if isinstance(m, nn.Conv2d | nn.Linear)]
    out = []
    for i, m in enumerate(layers):
        if isinstance(m, nn.Linear):
            g = "classifier"
        elif i == 0:
            g = "first"
        elif m.groups > 1:
            g = "depthwise"
        elif i == len(layers) - 2:
            g = "last"
        else:
            g = "pw_expand" if m.out_channels > m.in_channels else "pw_project"
        out.append((m, g))
    return out


def quantize_weight(w, bits: int):
    """Symmetric per-output-channel round-to-nearest fake quantization, amax = max |w|."""
    q = 2 ** (bits - 1) - 1
    s = w.abs().amax(dim=tuple(range(1, w.dim())), keepdim=True).clamp_min(1e-30) / q
    return (w / s).round().clamp(-q, q) * s


def main(argv: list[str] | None = None) -> int:
    import torch
    import vision

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--eval", type=int, default=500)
    ap.add_argument("--update-docs", type=Path, default=None)
    args = ap.parse_args(argv)
    torch.set_num_threads(min(2, os.cpu_count() or 1))
    x = torch.from_numpy(vision.image_crops("eval", args.eval))
    model = folded_model()
    layers = layer_groups(model)
    originals = [m.weight.data.clone() for m, _ in layers]

    def logits() -> np.ndarray:
        with torch.no_grad():
            return torch.cat([model(x[i:i + 50]) for i in range(0, len(x), 50)]).numpy()

    ref = logits()
    # the folded model is the exported one: check it against the unfolded checkpoint
    with torch.no_grad():
        plain = vision.mobilenet_v2(pretrained=True)
        drift = float(np.abs(torch.cat([plain(x[i:i + 50]) for i in range(0, len(x), 50)]).numpy() - ref).max())
    p = torch.softmax(torch.from_numpy(ref), 1).numpy()
    top2 = np.sort(p, 1)[:, -2:]
    margin = top2[:, 1] - top2[:, 0]
    rows: list[tuple[str, str]] = [
        ("FP32: crops whose top-1 / top-2 probability margin is < 0.01 / < 0.05 / < 0.10",
         f"{np.mean(margin < 0.01) * 100:.1f} % / {np.mean(margin < 0.05) * 100:.1f} % / {np.mean(margin < 0.10) * 100:.1f} %"),
        ("FP32: median top-1 probability", f"{np.median(top2[:, 1]):.3f}"),
    ]

    def measure(label: str, select, bits: int | None = 8, half: bool = False) -> None:
        for (m, g), w in zip(layers, originals, strict=True):
            if not select(g):
                m.weight.data = w.clone()
            elif half:
                m.weight.data = w.half().float()
            else:
                m.weight.data = quantize_weight(w, bits)
        out = logits()
        agree = out.argmax(1) == ref.argmax(1)
        cos = (out * ref).sum(1) / (np.linalg.norm(out, axis=1) * np.linalg.norm(ref, axis=1))
        confident = margin >= 0.10
        rows.append((label, f"top-1 agreement {agree.mean() * 100:.1f} % ({agree[confident].mean() * 100:.1f} % on the "
                            f"{confident.sum()} crops with margin >= 0.10), logit cosine {cos.mean():.4f}"))
        print(rows[-1], flush=True)

    measure("FP16 weights (noise floor)", lambda g: True, half=True)
    for group in GROUPS:
        n = sum(g == group for _, g in layers)
        measure(f"INT8 weights of {group} ({n} layer{'s' if n > 1 else ''}) only", lambda g, group=group: g == group)
    for bits in (8, 10, 12):
        measure(f"all weights at {bits} bits", lambda g: True, bits=bits)
    from _common import cpu_name, publish

    cpu = cpu_name()
    lines = [SECTION, "",
             f"`python bench/gauntlet/ceiling.py --eval {args.eval}` on {cpu}, {time.strftime('%Y-%m-%d')}: the trained "
             f"MobileNetV2 with BatchNorm folded (max logit difference to the unfolded model {drift:.1e}) on the "
             f"gauntlet's {len(x)} evaluation crops. Only weights are quantized (symmetric per output channel, round to "
             "nearest, amax = max |w|, as trtrepo, ONNX Runtime and TensorRT do); every activation stays FP32, so each row "
             "is an upper bound on the top-1 agreement of an INT8 model that rounds its weights to nearest.", "",
             "| configuration | vs FP32 |", "|---|---|"] + [f"| {a} | {b} |" for a, b in rows] + [""]
    publish("\n".join(lines), SECTION, args.update_docs)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
