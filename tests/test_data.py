from __future__ import annotations

import json
import sys
import textwrap

import numpy as np
import pytest
from PIL import Image

from trtrepo import demo
from trtrepo.data import Preprocess, collect, iter_batches, open_data
from trtrepo.errors import UsageError
from trtrepo.modelio import ModelIO


def _write_digit_pngs(folder, count=20, classes=True):
    images, labels = demo.raw_split("val")
    for i in range(count):
        sub = folder / f"class_{labels[i]}" if classes else folder
        sub.mkdir(parents=True, exist_ok=True)
        Image.fromarray(images[i], mode="L").save(sub / f"{i:04d}.png")
    return images[:count], labels[:count]


@pytest.mark.parametrize("suffix", [".json", ".yaml"])
def test_preprocess_file_round_trip(tmp_path, suffix):
    spec = Preprocess(resize=256, center_crop=224, interpolation="bicubic", color="bgr", scale=1 / 255,
                      mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225), layout="NHWC", dtype="float16",
                      input_name="pixels")
    path = spec.save(tmp_path / f"pre{suffix}")
    assert Preprocess.load(path) == spec
    assert spec.center_crop == (224, 224) and spec.resize == (256,)


def test_preprocess_rejects_bad_options(tmp_path):
    with pytest.raises(UsageError, match="'color'"):
        Preprocess(color="cmyk")
    with pytest.raises(UsageError, match="'mean': expected 1 or 3"):
        Preprocess(mean=(0.1, 0.2))
    bad = tmp_path / "pre.json"
    bad.write_text(json.dumps({"resize": 32, "flip": True}))
    with pytest.raises(UsageError, match="pre.json: unknown preprocess option.*flip"):
        Preprocess.load(bad)


def test_preprocess_apply_steps():
    img = Image.fromarray(np.arange(4 * 6 * 3, dtype=np.uint8).reshape(4, 6, 3), mode="RGB")
    out = Preprocess(scale=1.0, mean=(1, 2, 3), std=(2, 2, 2), color="bgr", layout="NCHW").apply(img)
    raw = np.asarray(img, dtype=np.float32)
    assert out.shape == (3, 4, 6) and out.dtype == np.float32
    np.testing.assert_allclose(out[0], (raw[:, :, 2] - 1) / 2)  # BGR: channel 0 is blue
    crop = Preprocess(resize=(8, 12), center_crop=(4, 4), layout="NHWC").apply(img)
    assert crop.shape == (4, 4, 3)
    short = Preprocess(resize=8).apply(img)  # shorter side 4 -> 8, width 6 -> 12
    assert short.shape == (3, 8, 12)


def test_image_folder_matches_demo_tensors(tmp_path, demo_onnx):
    images, labels = _write_digit_pngs(tmp_path / "imgs")
    pre = demo.preprocess()
    pre_file = pre.save(tmp_path / "pre.json")
    io = ModelIO.from_onnx(demo_onnx)
    src = open_data(str(tmp_path / "imgs"), io=io, preprocess=str(pre_file))
    assert len(src) == len(images) and src.has_labels
    arrays = collect(src, batch_size=7, io=io)
    # files are sorted by class folder then name, so compare per file
    expected = {f"{i:04d}.png": demo.to_tensors(images[i : i + 1])[0] for i in range(len(images))}
    for sample_file, arr in zip(src.files, arrays["input"], strict=True):
        np.testing.assert_array_equal(arr, expected[sample_file.name])
    # labels come from sorted class folder names
    names = [p.parent.name for p in src.files]
    assert list(src.labels()) == [sorted(set(names)).index(n) for n in names]


def test_image_folder_errors(tmp_path, demo_onnx):
    io = ModelIO.from_onnx(demo_onnx)
    folder = tmp_path / "imgs"
    _write_digit_pngs(folder, count=3, classes=False)
    with pytest.raises(UsageError, match="needs a preprocessing spec"):
        open_data(str(folder), io=io)
    (folder / "notes.txt").write_text("hello")
    with pytest.raises(UsageError, match=r"notes.txt: not an image file"):
        open_data(str(folder), io=io, preprocess=demo.preprocess())
    (folder / "notes.txt").unlink()
    (folder / "broken.png").write_bytes(b"not a png")  # refused when the folder is opened (its header)
    with pytest.raises(UsageError, match=r"broken.png: not an image \(cannot identify image file\)"):
        open_data(str(folder), io=io, preprocess=demo.preprocess())
    (folder / "broken.png").unlink()
    # a JPEG cut short reads as a JPEG (its header is whole): its pixels fail when decoded, naming it
    noise = (np.random.default_rng(0).random((128, 128)) * 255).astype(np.uint8)
    Image.fromarray(noise, mode="L").save(folder / "cut.jpg", quality=95)
    jpeg = (folder / "cut.jpg").read_bytes()
    (folder / "cut.jpg").write_bytes(jpeg[: len(jpeg) // 2])
    src = open_data(str(folder), io=io, preprocess=demo.preprocess())
    with pytest.raises(UsageError, match=r"cut.jpg: cannot read image"):
        collect(src, io=io)


def test_image_folder_with_wrong_shape_names_the_tensor(tmp_path, demo_onnx):
    folder = tmp_path / "imgs"
    _write_digit_pngs(folder, count=2, classes=False)
    rgb = Preprocess(resize=(32, 32), color="rgb")
    src = open_data(str(folder), io=ModelIO.from_onnx(demo_onnx), preprocess=rgb)
    with pytest.raises(UsageError, match=r"input 'input'.*\[2, 3, 32, 32\]"):
        list(iter_batches(src, 4, ModelIO.from_onnx(demo_onnx)))


def test_npy_and_npz_sources(tmp_path, demo_onnx):
    io = ModelIO.from_onnx(demo_onnx)
    x = np.random.default_rng(0).standard_normal((10, 1, 32, 32)).astype(np.float32)
    y = np.arange(10) % 3
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "y.npy", y)
    src = open_data(str(tmp_path / "x.npy"), io=io, labels=str(tmp_path / "y.npy"))
    batches = list(iter_batches(src, 4, io))
    assert [b.size for b in batches] == [4, 4, 2]
    np.testing.assert_array_equal(np.concatenate([b.inputs["input"] for b in batches]), x)
    np.testing.assert_array_equal(np.concatenate([b.labels for b in batches]), y)

    np.savez(tmp_path / "d.npz", input=x, labels=y)
    src = open_data(str(tmp_path / "d.npz"), io=io)
    assert src.has_labels and list(src.labels()) == list(y)

    # several named inputs
    np.savez(tmp_path / "multi.npz", input_ids=np.ones((6, 8), np.int64), attention_mask=np.ones((6, 8), np.int64))
    multi = open_data(str(tmp_path / "multi.npz"))
    assert set(next(iter(multi)).inputs) == {"input_ids", "attention_mask"} and not multi.has_labels


def test_npz_is_loaded_without_pickle(tmp_path):
    np.save(tmp_path / "obj.npy", np.array([{"a": 1}], dtype=object), allow_pickle=True)
    with pytest.raises(UsageError, match=r"obj.npy: an object array \(a pickle\)"):
        open_data(str(tmp_path / "obj.npy"))


def test_limit_and_seed_are_deterministic(demo_onnx):
    io = ModelIO.from_onnx(demo_onnx)
    a = open_data("demo:val", io=io, limit=50, seed=3)
    b = open_data("demo:val", io=io, limit=50, seed=3)
    c = open_data("demo:val", io=io, limit=50, seed=4)
    assert len(a) == 50
    assert list(a.indices) == list(b.indices)
    assert list(a.indices) != list(c.indices)
    assert list(a.indices) == sorted(a.indices)
    np.testing.assert_array_equal(collect(a)["input"], collect(b)["input"])
    with pytest.raises(UsageError, match="the sample limit must be positive"):
        open_data("demo:val", limit=0)


def test_take_selects_positions_and_leaves_the_source_alone(demo_onnx):
    src = open_data("demo:val", io=ModelIO.from_onnx(demo_onnx), limit=20, seed=1)
    part = src.take([5, 0, 19])
    assert len(part) == 3 and len(src) == 20 and type(part) is type(src)
    assert list(part.indices) == [src.indices[5], src.indices[0], src.indices[19]]
    np.testing.assert_array_equal(collect(part)["input"], collect(src)["input"][[5, 0, 19]])
    assert list(part.take([1]).indices) == [src.indices[0]]
    with pytest.raises(UsageError, match="out of range"):
        src.take([20])


def test_callable_sources(tmp_path, monkeypatch, demo_onnx):
    io = ModelIO.from_onnx(demo_onnx)
    mod = tmp_path / "userdata.py"
    mod.write_text(textwrap.dedent("""
        import numpy as np
        import torch

        def pairs():
            rng = np.random.default_rng(0)
            return [(rng.standard_normal((1, 32, 32)).astype("float32"), i % 10) for i in range(5)]

        class DS(torch.utils.data.Dataset):
            def __len__(self):
                return 7
            def __getitem__(self, i):
                return torch.full((1, 32, 32), float(i)), i

        def dataset():
            return DS()

        def broken():
            raise RuntimeError("boom")
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    src = open_data("userdata:pairs", io=io)
    assert len(src) == 5 and src.has_labels and list(src.labels()) == [0, 1, 2, 3, 4]
    ds = open_data("userdata:dataset", io=io, limit=3, seed=None)
    arr = collect(ds, io=io)["input"]
    assert arr.shape == (3, 1, 32, 32) and float(arr[2].max()) == 2.0
    with pytest.raises(UsageError, match="'userdata:broken': calling the data callable failed.*boom"):
        open_data("userdata:broken", io=io)
    with pytest.raises(UsageError, match="cannot import module 'no_such_module_xyz'"):
        open_data("no_such_module_xyz:data", io=io)
    with pytest.raises(UsageError, match="has no attribute 'nothing'"):
        open_data("userdata:nothing", io=io)
    sys.modules.pop("userdata", None)


def test_variable_length_samples_batch_by_shape():
    from trtrepo.data import ListSource, Sample

    items = [Sample({"ids": np.ones(n, np.int64)}) for n in (4, 4, 4, 6, 6, 4)]
    batches = list(iter_batches(ListSource("seq", items), 2))
    assert [b.inputs["ids"].shape for b in batches] == [(2, 4), (1, 4), (2, 6), (1, 4)]
    assert [list(b.indices) for b in batches] == [[0, 1], [2], [3, 4], [5]]


def test_missing_data_and_labels(tmp_path):
    with pytest.raises(UsageError, match="nothing.npy: data file not found"):
        open_data(str(tmp_path / "nothing.npy"))
    with pytest.raises(UsageError, match="data not found"):
        open_data(str(tmp_path / "nowhere"))
    np.save(tmp_path / "x.npy", np.zeros((3, 2), np.float32))
    with pytest.raises(UsageError, match="labels file not found"):
        open_data(str(tmp_path / "x.npy"), labels=str(tmp_path / "y.npy"))
    (tmp_path / "y.txt").write_text("1\n2\n")
    with pytest.raises(UsageError, match="2 labels for 3 samples"):
        open_data(str(tmp_path / "x.npy"), labels=str(tmp_path / "y.txt"))
    with pytest.raises(UsageError, match="demo data has no split 'test'"):
        open_data("demo:test")


def test_demo_splits_are_disjoint_and_deterministic():
    idx = demo.split_indices()
    assert not set(idx["train"]) & set(idx["val"])
    x, y = demo.split_tensors("val")
    assert x.shape == (597, 1, 32, 32) and x.dtype == np.float32 and y.shape == (597,)
    assert -1.0 <= float(x.min()) and float(x.max()) <= 1.0
    calib_x, _ = demo.split_tensors("calib")
    assert calib_x.shape == (demo.CALIB_COUNT, 1, 32, 32)
