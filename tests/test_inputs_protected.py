"""Issue 16 item 6: no command writes over what it reads. An output equal to an input (model,
data, cache, ranges, preprocessing file, labels) or inside an input folder is refused before any
work: exit 2, one line naming both, every input byte for byte as it was."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest


def fingerprint(root: Path) -> dict[str, str]:
    files = [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file())
    return {str(p): hashlib.sha256(p.read_bytes()).hexdigest() for p in files}


@pytest.fixture
def inputs(tmp_path, demo_onnx):
    from PIL import Image

    root = tmp_path / "inputs"
    root.mkdir()
    model = root / "model.onnx"
    model.write_bytes(Path(demo_onnx).read_bytes())
    rng = np.random.default_rng(0)
    np.save(root / "x.npy", rng.standard_normal((16, 1, 32, 32)).astype(np.float32))
    (root / "imgs").mkdir()
    for i in range(8):
        Image.fromarray((rng.random((32, 32)) * 255).astype(np.uint8), mode="L").save(root / "imgs" / f"{i}.png")
    (root / "pre.json").write_text('{"resize": [32, 32], "color": "L", "scale": 0.00392156862745098}\n')
    (root / "labels.txt").write_text("\n".join(str(i) for i in range(10)) + "\n")
    return root


CASES = [
    ("export", ["export", "{root}/model.onnx", "-o", "{root}/model.onnx"], "SOURCE"),
    ("quantize -o data", ["quantize", "{root}/model.onnx", "--data", "{root}/x.npy", "-o", "{root}/x.npy"], "--data"),
    ("quantize -o model", ["quantize", "{root}/model.onnx", "--data", "{root}/x.npy", "-o", "{root}/model.onnx"], "MODEL"),
    ("quantize --report in data", ["quantize", "{root}/model.onnx", "--data", "{root}/imgs", "--preprocess",
                                   "{root}/pre.json", "-o", "{root}/q.onnx", "--report", "{root}/imgs/report"], "--data"),
    ("evaluate --report in data", ["evaluate", "{root}/model.onnx", "{root}/model.onnx", "--data", "{root}/imgs",
                                   "--preprocess", "{root}/pre.json", "--report", "{root}/imgs"], "--data"),
    ("calibrate --ranges", ["calibrate", "{root}/model.onnx", "--data", "{root}/imgs", "--preprocess", "{root}/pre.json",
                            "--ranges", "{root}/pre.json"], "--preprocess"),
    ("build -o model", ["build", "{root}/model.onnx", "-o", "{root}/model.onnx"], "MODEL"),
    ("build --fp16-onnx", ["build", "{root}/model.onnx", "-o", "{root}/m.plan", "--fp16-onnx", "{root}/model.onnx"],
     "MODEL"),
    ("deploy --repo in data", ["deploy", "{root}/model.onnx", "--data", "{root}/imgs", "--preprocess", "{root}/pre.json",
                               "--repo", "{root}/imgs/repo"], "--data"),
    ("deploy --workdir", ["deploy", "{root}/model.onnx", "--data", "{root}/imgs", "--preprocess", "{root}/pre.json",
                          "--repo", "{root}/repo", "--workdir", "{root}/imgs"], "--data"),
    ("validate --report", ["validate", "--model", "m", "--reference", "{root}/model.onnx", "--data", "{root}/imgs",
                           "--preprocess", "{root}/pre.json", "--report", "{root}/imgs"], "--data"),
]


@pytest.mark.parametrize("case, args, culprit", CASES, ids=[c[0] for c in CASES])
def test_an_output_over_an_input_is_refused_before_any_work(inputs, run_cli, case, args, culprit):
    before = fingerprint(inputs)
    res = run_cli(*[a.format(root=inputs) for a in args])
    assert res.exit_code == 2, (case, res.output, res.stderr)
    line = res.stderr.strip()
    assert len(line.splitlines()) == 1 and culprit in line and ("overwritten" in line or "lies inside" in line), line
    assert fingerprint(inputs) == before


def test_a_repository_path_under_a_file_is_a_usage_error(inputs, run_cli):
    res = run_cli("repo", "add", inputs / "model.onnx", "--name", "m", "--repo", inputs / "labels.txt" / "r")
    assert res.exit_code == 2 and "labels.txt" in res.stderr and "not a folder" in res.stderr
