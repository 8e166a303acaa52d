"""Calibration under a memory budget: micro-batches and tensor groups give byte-identical statistics
(demo CNN, demo-text encoder with variable sequence lengths and a batch-independent position
embedding), and the peak memory of a real run stays within the budget where whole batches do not."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from trtrepo.calibrate import Calibrator, Statistics
from trtrepo.data import ArraySource, DataOptions
from trtrepo.errors import TrtrepoError, UsageError

TINY = 0.05  # MB: below one sample of either demo model, so micro-batches and tensor groups
HUGE = 1e6  # MB: whole batches (after the one-sample probe)


@pytest.fixture(scope="module")
def demo_text_onnx(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from trtrepo.export import export_onnx

    path = tmp_path_factory.mktemp("demo_text") / "demo_text.onnx"
    export_onnx("demo-text", path)
    return path


def assert_same_statistics(a: Statistics, b: Statistics, label: object) -> None:
    assert a.names == b.names and a.num_samples == b.num_samples, label
    for name in a.names:
        x, y = a[name], b[name]
        assert (x.max_abs, x.min, x.max) == (y.max_abs, y.min, y.max), (label, name)
        assert np.array_equal(x.counts, y.counts), (label, name)


def outputs(stats: Statistics, folder: Path, tag: str) -> tuple[bytes, bytes]:
    """The ranges JSON (with histogram summaries) and the TensorRT cache, as bytes."""
    ranges = stats.compute("entropy")
    json_path = ranges.save_json(folder / f"{tag}.json", stats)
    cache_path = ranges.write_cache(folder / f"{tag}.cache")
    return json_path.read_bytes(), cache_path.read_bytes()


@pytest.mark.parametrize(("model", "data", "limit"), [("demo", "demo:calib", 24), ("demo-text", "demo-text:calib", 40)])
def test_budget_does_not_change_the_statistics(model: str, data: str, limit: int, demo_onnx: Path,
                                               demo_text_onnx: Path, tmp_path: Path) -> None:
    path = demo_onnx if model == "demo" else demo_text_onnx
    reference: Statistics | None = None
    for batch_size in (7, 64):  # a batch cut by the budget, and one batch holding every sample
        runs: dict[float | None, Calibrator] = {}
        for budget in (None, HUGE, TINY):
            runs[budget] = Calibrator(path, DataOptions(data, limit=limit), batch_size=batch_size, progress=False,
                                      memory_budget_mb=budget)
            runs[budget].collect()
        whole = runs[None].statistics
        assert whole is not None
        expected = outputs(whole, tmp_path, f"whole{batch_size}")
        for budget in (HUGE, TINY):
            stats = runs[budget].statistics
            assert stats is not None
            assert_same_statistics(whole, stats, (batch_size, budget))
            assert outputs(stats, tmp_path, f"{budget}-{batch_size}") == expected, (batch_size, budget)
        # The tiny budget really cut batches and split the tensors into groups.
        groups = runs[TINY]._groups
        assert groups is not None and len(groups) > 1
        assert runs[HUGE]._groups == [runs[HUGE].tensors]
        if model == "demo-text" and batch_size > 1:
            # The position embedding does not depend on the batch: recognised and counted once per batch.
            assert runs[TINY]._independent.get("/pos/Gather_output_0") is True
            assert sum(runs[TINY]._independent.values()) == 1
        # Across batch sizes the maxima agree (pass 1 takes an exact max) up to float32 rounding: ONNX Runtime's
        # GEMMs block by batch size, and on an AMD EPYC without VNNI demo-text's embedding max moved by 1e-7
        # relative between batch 1 and 7 (within one batch size, above, the budget changes nothing at all).
        if reference is None:
            reference = whole
        for name in reference.names:
            assert whole[name].max_abs == pytest.approx(reference[name].max_abs, rel=1e-6, abs=0), (batch_size, name)
        if model == "demo":
            assert_same_statistics(reference, whole, batch_size)


def test_nan_on_a_micro_batch_names_its_samples(tmp_path: Path) -> None:
    graph = helper.make_graph([helper.make_node("Sqrt", ["x"], ["s"]), helper.make_node("Relu", ["s"], ["y"])], "nan",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [-1, 4096])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(tmp_path / "nan.onnx"))
    x = np.ones((12, 4096), np.float32)
    x[9, 7] = -1.0
    # 3 tensors of 16 KB per sample, budget 0.1 MB: two groups, runs of 2 or 3 samples (8..9 is one).
    cal = Calibrator(tmp_path / "nan.onnx", ArraySource("a", {"x": x}), batch_size=12, progress=False,
                     memory_budget_mb=0.1)
    with pytest.raises(TrtrepoError, match=r"tensor 's' has NaN values on samples 8\.\.9;"):
        cal.collect()


def test_budget_must_be_positive(demo_onnx: Path, run_cli) -> None:
    for bad in (0, -1.0, float("nan")):
        with pytest.raises(UsageError, match=r"the memory budget \(MB\) must be a positive number"):
            Calibrator(demo_onnx, "demo:calib", memory_budget_mb=bad)
    res = run_cli("calibrate", demo_onnx, "--data", "demo:calib", "--memory-budget-mb", 0)
    assert res.exit_code == 2 and "--memory-budget-mb" in res.stderr


def test_cli_memory_budget_writes_the_same_cache(run_cli, demo_onnx: Path, tmp_path: Path) -> None:
    caches = []
    for budget in ("512", "0.05"):
        cache = tmp_path / f"{budget}.cache"
        res = run_cli("calibrate", demo_onnx, "--data", "demo:calib", "--limit", 16, "--batch-size", 16,
                      "--memory-budget-mb", budget, "--cache", cache, "--no-progress")
        assert res.exit_code == 0, res.output
        caches.append(cache.read_bytes())
    assert caches[0] == caches[1]


# --------------------------------------------------------------------------------------------
# Peak memory of a real run, in a fresh process

# What both child processes start with: imports and a reader of /proc/self/status (bytes).
_CHILD_PRELUDE = r"""
import json, sys
import numpy as np
from trtrepo.calibrate import Calibrator
from trtrepo.data import ArraySource

def status(key):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
"""

_CHILD = _CHILD_PRELUDE + r"""
x = np.random.default_rng(1).standard_normal((64, 512, 128)).astype(np.float32)
cal = Calibrator(sys.argv[1], ArraySource("wide", {"x": x}), batch_size=64, progress=False,
                 memory_budget_mb=float(sys.argv[2]))
cal.session  # built before the baseline
base = status("VmRSS")
try:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset VmHWM to the current RSS
except OSError:
    base = max(base, status("VmHWM"))
stats = cal.collect()
print(json.dumps({"growth": status("VmHWM") - base, "tensors": len(stats)}))
"""


def wide_model(path: Path, seq: int = 512, hidden: int = 128, layers: int = 4) -> Path:
    """Residual MatMul/Add/Relu/Tanh blocks on a [batch, 512, 128] activation: 21 calibrated
    tensors of 256 KB per sample, so a batch of 64 fetches 336 MB."""
    rng = np.random.default_rng(0)
    nodes, inits, prev = [], [], "x"
    for i in range(layers):
        inits.append(numpy_helper.from_array((rng.standard_normal((hidden, hidden)) / np.sqrt(hidden)).astype(np.float32), f"w{i}"))
        inits.append(numpy_helper.from_array(rng.standard_normal(hidden).astype(np.float32), f"b{i}"))
        nodes += [helper.make_node("MatMul", [prev, f"w{i}"], [f"m{i}"]),
                  helper.make_node("Add", [f"m{i}", f"b{i}"], [f"a{i}"]),
                  helper.make_node("Relu", [f"a{i}"], [f"r{i}"]),
                  helper.make_node("Add", [f"r{i}", prev], [f"s{i}"]),
                  helper.make_node("Tanh", [f"s{i}"], [f"t{i}"])]
        prev = f"t{i}"
    graph = helper.make_graph(nodes, "wide", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", seq, hidden])],
                              [helper.make_tensor_value_info(prev, TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def peak_growth(model: Path, budget_mb: float) -> int:
    res = subprocess.run([sys.executable, "-c", _CHILD, str(model), str(budget_mb)], capture_output=True, text=True,
                         timeout=120, check=False)
    assert res.returncode == 0, res.stderr[-2000:]
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert out["tensors"] == 21
    return int(out["growth"])


@pytest.mark.skipif(not Path("/proc/self/status").is_file(), reason="needs /proc/self/status (VmHWM)")
def test_peak_memory_stays_within_the_budget(tmp_path: Path) -> None:
    model = wide_model(tmp_path / "wide.onnx")
    mb = 2**20
    budget = 32
    # The margin covers what the budget does not: the stacked batch of inputs (16 MB) and the
    # histogram's scratch arrays.
    limit = (budget + 48) * mb
    bounded = peak_growth(model, budget)
    whole = peak_growth(model, HUGE)
    assert bounded < limit, f"peak growth {bounded / mb:.0f} MB with a {budget} MB budget"
    assert whole > 300 * mb, f"whole batches should fetch ~336 MB, peak growth {whole / mb:.0f} MB"


# --------------------------------------------------------------------------------------------
# The weights: never in Python, one copy in ONNX Runtime

_BUILD_CHILD = _CHILD_PRELUDE + r"""
import onnx, onnxruntime
base = status("VmRSS")
x = np.random.default_rng(1).standard_normal((8, 1024)).astype(np.float32)
cal = Calibrator(sys.argv[1], ArraySource("x", {"x": x}), batch_size=8, progress=False)
stats = cal.collect()
print(json.dumps({"growth": status("VmHWM") - base, "graph_bytes": cal.model.ByteSize(), "tensors": len(stats)}))
"""


def heavy_model(path: Path, layers: int = 16, hidden: int = 1024) -> int:
    """MatMul/Relu layers with ``layers`` x 4 MB of weights embedded in the file; returns their bytes."""
    rng = np.random.default_rng(0)
    nodes, inits, prev = [], [], "x"
    for i in range(layers):
        inits.append(numpy_helper.from_array((rng.standard_normal((hidden, hidden)) / np.sqrt(hidden)).astype(np.float32), f"w{i}"))
        nodes += [helper.make_node("MatMul", [prev, f"w{i}"], [f"m{i}"]), helper.make_node("Relu", [f"m{i}"], [f"r{i}"])]
        prev = f"r{i}"
    graph = helper.make_graph(nodes, "heavy", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", hidden])],
                              [helper.make_tensor_value_info(prev, TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return layers * hidden * hidden * 4


@pytest.mark.skipif(not Path("/proc/self/status").is_file(), reason="needs /proc/self/status (VmHWM)")
def test_calibration_holds_one_copy_of_the_weights(tmp_path: Path) -> None:
    """Loading, selecting tensors, building the session and calibrating a model with 64 MB of
    embedded weights peaks at about one copy of them (the session's packed weights; 1.3x measured): the graph is
    read without the weights and the session maps them from a file (before: ~6 copies)."""
    weights = heavy_model(tmp_path / "heavy.onnx")
    res = subprocess.run([sys.executable, "-c", _BUILD_CHILD, str(tmp_path / "heavy.onnx")], capture_output=True,
                         text=True, timeout=120, check=False)
    assert res.returncode == 0, res.stderr[-2000:]
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert out["tensors"] == 33
    assert out["graph_bytes"] < 64 * 1024, "the calibrator's model should not hold the weights"
    assert out["growth"] < 2 * weights, f"peak growth {out['growth'] / 2**20:.0f} MB for {weights / 2**20:.0f} MB of weights"


def augmented_outputs(path: Path, tensors: list[str], inputs: dict[str, np.ndarray]) -> list[np.ndarray]:
    """The tensors computed by a session built from the whole model in memory (weights inline),
    as before the weights file."""
    import onnxruntime as ort

    from trtrepo.calibrate import inferred_types

    model = onnx.load(str(path))
    types = inferred_types(model)
    outputs = {o.name for o in model.graph.output}
    model.graph.output.extend(helper.make_tensor_value_info(n, types[n], None) for n in tensors if n not in outputs)
    options = ort.SessionOptions()
    options.log_severity_level = 3
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return list(session.run(tensors, inputs))


def test_external_data_models_calibrate_the_same(demo_text_onnx: Path, tmp_path: Path) -> None:
    """A model saved with external data (in a subfolder) calibrates like the same model with its
    weights embedded, with the bits of a session built from the whole model in memory; external
    data outside the model's folder is refused; a file that is not ONNX gets a usage error."""
    model = onnx.load(str(demo_text_onnx))
    (tmp_path / "ext" / "weights").mkdir(parents=True)
    external = tmp_path / "ext" / "model.onnx"
    onnx.save(model, str(external), save_as_external_data=True, location="weights/model.bin", size_threshold=1024)
    assert onnx.load(str(external), load_external_data=False).ByteSize() < demo_text_onnx.stat().st_size / 2

    results = []
    for path in (demo_text_onnx, external):
        cal = Calibrator(path, DataOptions("demo-text:calib", limit=12), batch_size=6, progress=False)
        stats = cal.collect()
        results.append(outputs(stats, tmp_path, path.parent.name))
    assert results[0] == results[1]

    from trtrepo.data import iter_batches

    first = next(iter(iter_batches(cal.source, 4, cal.io)))
    got = cal.session.run(cal.tensors, dict(first.inputs))
    want = augmented_outputs(demo_text_onnx, cal.tensors, dict(first.inputs))
    for name, a, b in zip(cal.tensors, got, want, strict=True):
        assert a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes(), name

    # External data that escapes the model's folder.
    escape = onnx.load(str(external), load_external_data=False)
    for t in escape.graph.initializer:
        for entry in t.external_data:
            if entry.key == "location":
                entry.value = "../outside.bin"
    (tmp_path / "outside.bin").write_bytes((tmp_path / "ext" / "weights" / "model.bin").read_bytes())
    onnx.save(escape, str(tmp_path / "ext" / "escape.onnx"))
    with pytest.raises(UsageError, match="external data location .*outside the model.s folder"):
        Calibrator(tmp_path / "ext" / "escape.onnx", DataOptions("demo-text:calib", limit=4), progress=False).collect()

    (tmp_path / "bad.onnx").write_bytes(b"not an ONNX model\n" * 100)
    with pytest.raises(UsageError, match="bad.onnx: not a readable ONNX model"):
        Calibrator(tmp_path / "bad.onnx", "demo-text:calib")
