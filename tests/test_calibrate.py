"""Calibration on real models with ONNX Runtime: tensor selection, MinMax against ONNX Runtime's
calibrator, entropy against ModelOpt on real activation histograms, streaming == batch, variable
shapes, NaN reporting, image folders, and the ``trtrepo calibrate`` CLI."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from trtrepo import rangemath as H
from trtrepo.cache import read_cache
from trtrepo.calibrate import CALIBRATED_OPS, Calibrator, HistogramOptions, Ranges, Statistics, select_tensors
from trtrepo.data import ArraySource, ListSource, Sample
from trtrepo.demo import raw_split, split_tensors
from trtrepo.errors import TrtrepoError

N = 96  # calibration samples used by most tests (kept small: 2 cores)


@pytest.fixture(scope="module")
def calib_x() -> np.ndarray:
    return split_tensors("calib")[0][:N]


@pytest.fixture(scope="module")
def demo_stats(demo_onnx: Path, calib_x: np.ndarray) -> Statistics:
    return Calibrator(demo_onnx, ArraySource("calib", {"input": calib_x}), batch_size=32, progress=False).collect()


def tiny_model(path: Path, nodes: list, dims: list, *, inp: str = "x", out: str = "y") -> Path:
    graph = helper.make_graph(
        nodes, "tiny",
        [helper.make_tensor_value_info(inp, TensorProto.FLOAT, dims)],
        [helper.make_tensor_value_info(out, TensorProto.FLOAT, None)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def test_selection_covers_inputs_and_quantized_ops(demo_onnx: Path) -> None:
    model = onnx.load(str(demo_onnx))
    names = select_tensors(model)
    initializers = {i.name for i in model.graph.initializer}
    assert names[0] == "input" and "logits" in names
    assert not initializers & set(names)
    for node in model.graph.node:
        if node.op_type in CALIBRATED_OPS:
            assert node.output[0] in names, node.op_type
    # Flatten is not a calibrated op, but its output feeds Gemm, so it is calibrated as Gemm's input.
    assert "/Flatten_output_0" in names
    assert len(names) == len(set(names))


def test_minmax_matches_onnxruntime_minmax_calibrator(demo_onnx: Path, demo_stats: Statistics,
                                                      calib_x: np.ndarray, tmp_path: Path) -> None:
    from onnxruntime.quantization.calibrate import CalibrationDataReader, CalibrationMethod, create_calibrator

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.batches = iter([{"input": calib_x[i : i + 16]} for i in range(0, N, 16)])

        def get_next(self) -> dict | None:
            return next(self.batches, None)

    ort_cal = create_calibrator(str(demo_onnx), op_types_to_calibrate=sorted(CALIBRATED_OPS),
                                augmented_model_path=str(tmp_path / "augmented.onnx"),
                                calibrate_method=CalibrationMethod.MinMax)
    ort_cal.collect_data(Reader())
    data = ort_cal.compute_data()
    ours = demo_stats.compute("minmax")
    common = [n for n in ours if n in data]
    assert len(common) == len(ours)  # ORT selects the same tensors for the same op types
    for name in common:
        lo, hi = (float(np.asarray(v).reshape(-1)[0]) for v in data[name].range_value)
        assert demo_stats[name].min == pytest.approx(lo, rel=1e-5, abs=1e-6), name
        assert demo_stats[name].max == pytest.approx(hi, rel=1e-5, abs=1e-6), name
        assert ours[name] == pytest.approx(max(abs(lo), abs(hi)), rel=1e-5), name


def test_entropy_and_percentile_on_real_activations_match_modelopt(demo_stats: Statistics) -> None:
    mo = pytest.importorskip("modelopt.torch.quantization.calib.histogram",
                             reason="nvidia-modelopt (test extra) is not installed")
    names = ["/features/features.5/conv2/conv2.0/Conv_output_0"]  # one tensor: the reference is slow (Python loops)
    entropy = demo_stats.compute("entropy")
    for name in names:
        t = demo_stats[name]
        cal = mo.HistogramCalibrator(num_bits=8, axis=None, unsigned=False)
        cal._calib_hist, cal._calib_bin_edges = t.counts.copy(), t.edges.copy()
        ref = float(cal.compute_amax("entropy"))
        width = t.edges[1] - t.edges[0]
        assert abs(entropy[name] - ref) <= width + 1e-6 * ref, name
        assert entropy[name] < t.max_abs


def test_one_collection_serves_every_method(demo_stats: Statistics) -> None:
    r = {m: demo_stats.compute(m) for m in H.METHODS}
    for name in demo_stats.names:
        assert r["minmax"][name] == demo_stats[name].max_abs
        for m in ("entropy", "percentile", "mse"):
            assert 0 < r[m][name] <= r["minmax"][name]
    # Entropy clips something on most activations of a CNN.
    assert sum(r["entropy"][n] < r["minmax"][n] for n in demo_stats.names) >= len(demo_stats) // 2
    assert r["percentile"].method == "percentile" and r["percentile"].options == {"percentile": 99.99}


def test_streaming_equals_batch_and_order_does_not_matter(demo_onnx: Path, demo_stats: Statistics,
                                                          calib_x: np.ndarray) -> None:
    perm = np.random.default_rng(5).permutation(N)
    runs = {
        "one batch": Calibrator(demo_onnx, ArraySource("a", {"input": calib_x}), batch_size=N, progress=False),
        "batch 7, shuffled": Calibrator(demo_onnx, ArraySource("b", {"input": calib_x[perm]}), batch_size=7, progress=False),
    }
    for label, cal in runs.items():
        stats = cal.collect()
        assert stats.num_samples == N
        for name in demo_stats.names:
            assert stats[name].max_abs == demo_stats[name].max_abs, (label, name)
            assert np.array_equal(stats[name].counts, demo_stats[name].counts), (label, name)
        for method in H.METHODS:
            assert dict(stats.compute(method)) == dict(demo_stats.compute(method)), (label, method)


def test_histograms_hold_every_value_once(demo_stats: Statistics) -> None:
    t = demo_stats["input"]
    assert t.num_values == N * 32 * 32
    assert t.max_abs == pytest.approx(1.0) and t.min == pytest.approx(-1.0)


def test_variable_shapes_and_tensor_statistics(tmp_path: Path) -> None:
    w = helper.make_tensor("w", TensorProto.FLOAT, [2, 1, 3, 3], np.linspace(-1, 1, 18).astype(np.float32).tolist())
    model = tmp_path / "var.onnx"
    tiny_model(model, [
        helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"]),
        helper.make_node("GlobalAveragePool", ["r"], ["y"]),
    ], [-1, 1, "h", "w"])
    m = onnx.load(str(model))
    m.graph.initializer.append(w)
    onnx.save(m, str(model))
    rng = np.random.default_rng(0)
    samples = [Sample({"x": rng.standard_normal((1, h, h)).astype(np.float32)}) for h in (5, 5, 8, 8, 8, 3, 5)]
    stats = Calibrator(model, ListSource("var", samples), batch_size=4, progress=False).collect()
    assert stats.names == ["x", "c", "r", "y"]
    # Against plain numpy on the raw inputs: every value counted once, exact max.
    xs = np.concatenate([s.inputs["x"].reshape(-1) for s in samples])
    assert stats["x"].max_abs == float(np.abs(xs).max())
    expected = H.accumulate(np.zeros(2048, np.int64), xs, stats["x"].max_abs)
    assert np.array_equal(stats["x"].counts, expected)
    assert stats["r"].min >= 0 and stats["r"].num_values == 2 * sum(s.inputs["x"].size for s in samples)


def test_nan_is_reported_with_the_tensor_name(tmp_path: Path) -> None:
    model = tiny_model(tmp_path / "nan.onnx", [
        helper.make_node("Sqrt", ["x"], ["s"]),
        helper.make_node("Relu", ["s"], ["y"]),
    ], [-1, 4])
    x = np.asarray([[1, 2, 3, 4], [1, -1, 1, 1]], np.float32)
    cal = Calibrator(model, ArraySource("a", {"x": x}), batch_size=1, progress=False)
    with pytest.raises(TrtrepoError, match=r"tensor 's' has NaN values on samples 1\.\.1"):
        cal.collect()


def test_all_zero_activation_does_not_crash(tmp_path: Path) -> None:
    model = tiny_model(tmp_path / "zero.onnx", [
        helper.make_node("Neg", ["x"], ["n"]),
        helper.make_node("Relu", ["n"], ["y"]),
    ], [-1, 3])
    x = np.abs(np.random.default_rng(0).standard_normal((10, 3))).astype(np.float32)
    stats = Calibrator(model, ArraySource("a", {"x": x}), progress=False).collect()
    for method in H.METHODS:
        r = stats.compute(method)
        assert r["y"] == 0.0  # Relu(-|x|) is all zeros
        assert 0 < r["n"] <= float(np.abs(x).max())
        assert r.scales()["y"] > 0


def test_statistics_npz_round_trip(demo_stats: Statistics, tmp_path: Path) -> None:
    back = Statistics.load_npz(demo_stats.save_npz(tmp_path / "s.npz"))
    assert back.names == demo_stats.names and back.num_samples == N
    assert dict(back.compute("entropy")) == dict(demo_stats.compute("entropy"))


# --------------------------------------------------------------------------------------------
# CLI


def test_cli_demo_all_outputs_and_cache_reuse(run_cli, demo_onnx: Path, tmp_path: Path) -> None:
    cache, ranges, dr = tmp_path / "d.cache", tmp_path / "d.json", tmp_path / "d.txt"
    res = run_cli("calibrate", demo_onnx, "--data", "demo:calib", "--limit", 64, "--method", "entropy",
                  "--cache", cache, "--ranges", ranges, "--dynamic-range", dr, "--no-progress")
    assert res.exit_code == 0, res.output
    header, scales = read_cache(cache)
    assert header.text == "TRT-101300-EntropyCalibration2"
    data = json.loads(ranges.read_text())
    assert data["method"] == "entropy" and data["num_samples"] == 64
    assert set(data["tensors"]) == set(scales)
    entry = data["tensors"]["/features/features.1/relu/Relu_output_0"]
    assert entry["scale"] == pytest.approx(entry["amax"] / 127, rel=1e-7)
    assert entry["histogram"]["num_values"] == 64 * 16 * 32 * 32
    assert 0 <= entry["histogram"]["clipped_fraction"] < 0.01
    assert dr.read_text().splitlines()[0] == "input:1.0"

    # Reuse: the cache exists, no --recalibrate: no data is needed and the cache is untouched.
    before = cache.read_bytes()
    res = run_cli("calibrate", demo_onnx, "--cache", cache, "--ranges", tmp_path / "again.json")
    assert res.exit_code == 0 and "reused calibration cache" in res.output
    assert cache.read_bytes() == before
    again = Ranges.load_json(tmp_path / "again.json")
    assert again.scales() == pytest.approx(scales, rel=0) and again.method == "cache"

    # --recalibrate rebuilds it with another method.
    res = run_cli("calibrate", demo_onnx, "--data", "demo:calib", "--limit", 64, "--method", "minmax",
                  "--cache", cache, "--recalibrate", "--trt-version", "8.6.1", "--no-progress")
    assert res.exit_code == 0, res.output
    assert cache.read_text().startswith("TRT-8601-MinMaxCalibration\n")


@pytest.mark.parametrize("method", ["minmax", "percentile", "mse"])
def test_cli_methods_print_ranges(run_cli, demo_onnx: Path, method: str) -> None:
    res = run_cli("calibrate", demo_onnx, "--data", "demo:calib", "--limit", 32, "--method", method,
                  "--percentile", "99.9", "--num-bins", "512", "--no-progress")
    assert res.exit_code == 0, res.output
    assert f"with {method}" in res.output and "(512 bins)" in res.output
    assert "/features/features.5/relu/Relu_output_0" in res.output


def test_cli_image_folder_matches_in_memory_tensors(run_cli, demo_onnx: Path, tmp_path: Path) -> None:
    from PIL import Image

    images, _ = raw_split("val")
    folder = tmp_path / "digits"
    folder.mkdir()
    for i, img in enumerate(images[:40]):
        Image.fromarray(img, mode="L").save(folder / f"{i:03d}.png")
    pre = tmp_path / "pre.json"
    assert run_cli("preprocess", "--demo", "-o", pre).exit_code == 0
    out = tmp_path / "folder.json"
    res = run_cli("calibrate", demo_onnx, "--data", folder, "--preprocess", pre, "--method", "entropy",
                  "--batch-size", 16, "--ranges", out, "--no-progress")
    assert res.exit_code == 0, res.output
    from trtrepo.demo import to_tensors

    api = Calibrator(demo_onnx, ArraySource("mem", {"input": to_tensors(images[:40])}), progress=False).compute("entropy")
    assert dict(Ranges.load_json(out)) == dict(api)


def test_cli_refuses_mismatching_cache(run_cli, demo_onnx: Path, tmp_path: Path) -> None:
    cache = tmp_path / "other.cache"
    cache.write_text("TRT-101300-EntropyCalibration2\ninput: 3c010204\nnot_a_tensor: 3c010204\n")
    out = tmp_path / "r.json"
    res = run_cli("calibrate", demo_onnx, "--cache", cache, "--ranges", out)
    assert res.exit_code == 2
    err = res.stderr.strip()
    assert "\n" not in err and "does not match the model" in err
    assert "not in the model: not_a_tensor" in err and "missing from it:" in err
    assert not out.exists()


@pytest.mark.parametrize(("args", "match"), [
    ([], "--data is required"),
    (["--data", "demo:calib", "--trt-version", "ten"], "--trt-version"),
    (["--data", "demo:nope"], "no split"),
    (["--data", "demo:calib", "--method", "kl"], "Invalid value for '--method'"),
])
def test_cli_usage_errors_write_nothing(run_cli, demo_onnx: Path, tmp_path: Path, args: list, match: str) -> None:
    out = tmp_path / "c.cache"
    res = run_cli("calibrate", demo_onnx, *args, "--cache", out)
    assert res.exit_code == 2
    assert match in res.stderr
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_cli_missing_model_and_nan_model(run_cli, tmp_path: Path) -> None:
    res = run_cli("calibrate", tmp_path / "missing.onnx", "--data", "demo:calib")
    assert res.exit_code == 2 and "ONNX file not found" in res.stderr
    model = tiny_model(tmp_path / "nan.onnx", [helper.make_node("Log", ["input"], ["l"]), helper.make_node("Relu", ["l"], ["y"])],
                       [-1, 1, 32, 32], inp="input")
    out = tmp_path / "nan.cache"
    res = run_cli("calibrate", model, "--data", "demo:calib", "--limit", 8, "--cache", out, "--no-progress")
    assert res.exit_code == 1
    assert res.stderr.strip().count("\n") == 0 and "tensor 'l' has NaN values" in res.stderr
    assert not out.exists()


@pytest.mark.parametrize("flag", ["--ranges", "--dynamic-range", "--cache"])
@pytest.mark.parametrize("target", ["model", "data"])
def test_cli_refuses_outputs_that_name_its_inputs(tmp_path, demo_onnx, run_cli, flag, target):
    """An output pointed at the model or the data file would replace it: refused, nothing written."""
    import shutil

    model = tmp_path / "m.onnx"
    shutil.copy(demo_onnx, model)
    data = tmp_path / "x.npy"
    np.save(data, np.random.default_rng(0).standard_normal((8, 1, 32, 32)).astype(np.float32))
    victim = model if target == "model" else data
    before = victim.read_bytes()
    res = run_cli("calibrate", model, "--data", data, flag, victim, "--recalibrate")
    assert res.exit_code == 2, res.output
    culprit = "MODEL" if target == "model" else "--data"
    assert f"is {culprit} {victim}, which this command reads; it would be overwritten" in res.stderr
    assert victim.read_bytes() == before


def _big_map_model(path: Path) -> Path:
    """input [N, 3, 96, 96] -> Conv 8x3x3 -> Relu -> output: 73,728 values per sample after the conv,
    more than a histogram takes per sample (DEFAULT_HISTOGRAM_SAMPLE)."""
    rng = np.random.default_rng(3)
    w = helper.make_tensor("w", TensorProto.FLOAT, [8, 3, 3, 3], rng.standard_normal(216).astype(np.float32).tolist())
    nodes = [helper.make_node("Conv", ["input", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["output"])]
    graph = helper.make_graph(nodes, "big", [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["N", 3, 96, 96])],
                              [helper.make_tensor_value_info("output", TensorProto.FLOAT, ["N", 8, 96, 96])], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def test_histograms_of_large_maps_are_sampled_per_sample_and_stay_batch_invariant(tmp_path):
    """Pass 2 reads a map of more than DEFAULT_HISTOGRAM_SAMPLE values per sample at an even stride:
    every sample the same positions, so ranges stay byte-identical across batch sizes; max and
    min/max stay exact; the histogram methods land within a few percent of the full histogram's."""
    from trtrepo.calibrate import DEFAULT_HISTOGRAM_SAMPLE

    model = _big_map_model(tmp_path / "big.onnx")
    x = np.random.default_rng(0).laplace(size=(13, 3, 96, 96)).astype(np.float32)
    src = ArraySource("big", {"input": x})

    def stats(batch: int, sample: int | None) -> Statistics:
        return Calibrator(model, src, batch_size=batch, progress=False, tensors=["c"],
                          histograms=HistogramOptions(sample=sample)).collect()

    sampled = {b: stats(b, DEFAULT_HISTOGRAM_SAMPLE) for b in (1, 4, 13)}
    full = stats(4, None)
    t = sampled[1]["c"]
    assert t.num_values < full["c"].num_values / 4  # the sample is a fraction of the 13 x 73,728 values
    for b in (4, 13):
        assert np.array_equal(sampled[b]["c"].counts, t.counts)
        assert sampled[b]["c"].max_abs == t.max_abs == full["c"].max_abs  # pass 1 sees everything
    for method in H.METHODS:
        ours, ref = sampled[1].compute(method)["c"], full.compute(method)["c"]
        assert ours == pytest.approx(ref, rel=0.05), method
