"""Extension points with one owner (issues 14 and 29): a calibration method, a Triton backend (and
its template), a Q/DQ target, a built-in model, a data source kind and a model source kind each come from a separate package through its
entry points (trtrepo.plugins), with nothing else touched.

The plug-in package is written to a temporary folder (its modules, its template, and a
``*.dist-info`` with ``METADATA`` and ``entry_points.txt``: what pip installs) and put on the
``PYTHONPATH`` of child interpreters running the real CLI. The files each kind touches are counted
against what docs/architecture.md's "Where to add" states.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from trtrepo import rangemath as H


def test_registry_is_what_compute_amax_dispatches_to() -> None:
    rng = np.random.default_rng(0)
    x = rng.laplace(size=100_000)
    m = float(np.abs(x).max())
    counts = H.accumulate(np.zeros(2048, np.int64), x, m)
    edges = H.histogram_edges(m, 2048)
    assert H.method_names() == tuple(H.METHODS) == ("entropy", "minmax", "percentile", "mse")
    assert H.method_names(auto=True)[-1] == "auto"
    assert H.compute_amax("minmax", counts, edges, m) == m
    assert H.compute_amax("percentile", counts, edges, m, percentile=50.0) < H.compute_amax("percentile", counts, edges, m)
    with pytest.raises(ValueError, match="unknown calibration method 'nope'"):
        H.compute_amax("nope", counts, edges, m)
    with pytest.raises(ValueError, match="already registered"):
        H.register(H.CalibrationMethod("minmax", lambda c, e, m, **o: m))


def test_shipped_records_are_declared_as_entry_points() -> None:
    """pyproject.toml declares exactly the shipped records, under their names, pointing at the
    objects the registries hold; the built-in models' own list (``builtin.OWN``) says the same."""
    import tomllib

    from trtrepo import plugins
    from trtrepo.contracts import backends, builtin
    from trtrepo.data import DATA_SOURCES
    from trtrepo.modelsource import MODEL_SOURCES
    from trtrepo.qdq import QDQ_TARGETS

    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"]
    assert sorted(declared) == sorted(plugins.GROUPS)
    registries = {plugins.CALIBRATION_METHODS: H.METHODS, plugins.BACKENDS: {s.name: s for s in backends.BACKENDS.values()},
                  plugins.QDQ_TARGETS: QDQ_TARGETS, plugins.DATA_SOURCES: DATA_SOURCES,
                  plugins.MODEL_SOURCES: MODEL_SOURCES}
    for group, registry in registries.items():
        eps = {ep.name: ep for ep in plugins.entry_points(group)}
        assert list(declared[group]) == list(registry), group  # same names, same order
        for name, ep in eps.items():
            assert ep.load() is registry[name], (group, name)
    assert builtin.names() == tuple(declared[plugins.BUILTIN_MODELS]) == ("demo", "demo-text")
    assert builtin.OWN == declared[plugins.BUILTIN_MODELS]
    assert builtin.builtin("demo").name == "demo" and builtin.module_of("demo-text") == "trtrepo.demo.text"


def test_one_name_per_backend_and_reverse_lookup() -> None:
    """The --backend name is the backend's name; a parsed config maps back to its spec whether it
    names Triton's platform or its backend library; tune reads the thread parameter off the spec."""
    from trtrepo.contracts import backends
    from trtrepo.tune import backend_of

    assert backends.options() == ("tensorrt", "onnxruntime", "python")
    for platform, backend, kind in (("tensorrt_plan", "", "tensorrt_plan"), ("", "tensorrt", "tensorrt_plan"),
                                    ("onnxruntime_onnx", "", "onnxruntime_onnx"), ("", "onnxruntime", "onnxruntime_onnx"),
                                    ("", "python", "python_onnx"), ("ensemble", "", "ensemble")):
        spec = backends.for_config(platform, backend)
        assert spec is not None and spec.kind == kind, (platform, backend)
    assert backends.for_config("", "openvino") is None

    class Msg:
        def __init__(self, platform: str, backend: str) -> None:
            self.platform, self.backend = platform, backend

    assert [backend_of(Msg(*pb)) for pb in (("tensorrt_plan", ""), ("onnxruntime_onnx", ""), ("", "python"),
                                            ("", "openvino"))] == ["tensorrt", "onnxruntime", "python", "openvino"]
    assert {s.name: s.threads_parameter for s in backends.BACKENDS.values() if s.threads_parameter} == {
        "onnxruntime": "intra_op_thread_count", "python": "intra_op_threads"}


# --------------------------------------------------------------------------------------------
# The plug-in package: one file per record, the backend's template, the entry points.

ROOT = Path(__file__).resolve().parent.parent
ENTRY_POINTS = "trtrepo_extras-0.1.dist-info/entry_points.txt"

PLUGIN_FILES = {
    "trtrepo_extras/p90.py": """
        from trtrepo.rangemath import CalibrationMethod, amax_percentile

        # amax = the 90th percentile of |x| (clips far more than any shipped method)
        P90 = CalibrationMethod("p90", lambda c, e, m, **o: amax_percentile(c, e, 90.0),
                                cache_algorithm="MinMaxCalibration", help="90th percentile of |x|")
        """,
    "trtrepo_extras/openvino.py": """
        from pathlib import Path

        from trtrepo.contracts.backends import BackendSpec

        # its INT8 model is placed by the plug-in's own Q/DQ target
        OPENVINO = BackendSpec("openvino_onnx", "openvino.pbtxt.j2", backend="openvino", model_file="model.onnx",
                               option="openvino", source="onnx", server_backend="openvino", quantize_target="ortlite",
                               template_dir=str(Path(__file__).parent))
        """,
    "trtrepo_extras/openvino.pbtxt.j2": """
        {%- import "_macros.j2" as c -%}
        # Generated by trtrepo: OpenVINO model
        {{ c.header(m) }}
        {{- c.io(m) }}
        {{- c.dynamic_batching(m) }}
        {{- c.instance_group(m) }}
        {{- c.parameters(m) }}
        """,
    "trtrepo_extras/ortlite.py": """
        from trtrepo.qdq import QdqTarget, rule_weighted_op_inputs

        # Q/DQ in front of the weighted ops only: uint8 activations, int8 weight initializers
        ORTLITE = QdqTarget("ortlite", (rule_weighted_op_inputs,), activations="asymmetric", weights="int8",
                            help="weighted ops only, uint8 activations, int8 weights")
        """,
    "trtrepo_extras/tiny.py": """
        import numpy as np

        from trtrepo.contracts.builtin import BuiltinModel


        def build_model():
            import torch

            torch.manual_seed(0)
            return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3)).eval()


        def inputs():
            from trtrepo.export import InputShape

            return [InputShape("x", (8,))]


        def open_data(split):
            from trtrepo.data import ArraySource

            x = np.random.default_rng(len(split)).normal(size=(160, 8)).astype(np.float32)
            return ArraySource(f"tiny:{split}", {"x": x}, (x[:, 0] > 0).astype(np.int64))


        BUILTIN = BuiltinModel("tiny", build_model, inputs, ("logits",), open_data)
        """,
    "trtrepo_extras/csvdata.py": """
        import numpy as np

        from trtrepo.data import ArraySource, DataSourceKind


        def is_csv(request):
            return request.path.suffix == ".csv" and request.path.is_file()


        def open_csv(request):
            # one sample per row, shaped like the model's only input (its axes after the batch axis)
            rows = np.loadtxt(request.path, delimiter=",", dtype=np.float32, ndmin=2)
            return ArraySource(str(request.path), {None: rows.reshape(len(rows), *request.io.inputs[0].shape[1:])})


        CSV = DataSourceKind("csv", is_csv, open_csv)
        """,
    "trtrepo_extras/mlp.py": """
        import re

        from trtrepo.modelsource import ModelSource, ModelSourceKind, import_torch

        SPEC = re.compile(r"mlp://(\\d+)-(\\d+)-(\\d+)")  # mlp://IN-HIDDEN-OUT


        def resolve(spec, weights):
            return ModelSource("mlp", spec, weights) if SPEC.fullmatch(spec) else None


        def load(source):
            torch = import_torch()
            n_in, hidden, n_out = (int(g) for g in SPEC.fullmatch(source.location).groups())
            torch.manual_seed(0)
            return torch.nn.Sequential(torch.nn.Linear(n_in, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, n_out)).eval()


        # the spec is the whole model: it stands for the model's files in the reference cache's key
        MLP = ModelSourceKind("mlp", resolve, load, files_key=lambda source: source.location)
        """,
    "trtrepo_extras-0.1.dist-info/METADATA": """
        Metadata-Version: 2.1
        Name: trtrepo-extras
        Version: 0.1
        """,
    ENTRY_POINTS: """
        [trtrepo.calibration_methods]
        p90 = trtrepo_extras.p90:P90

        [trtrepo.backends]
        openvino = trtrepo_extras.openvino:OPENVINO

        [trtrepo.qdq_targets]
        ortlite = trtrepo_extras.ortlite:ORTLITE

        [trtrepo.builtin_models]
        tiny = trtrepo_extras.tiny:BUILTIN

        [trtrepo.data_sources]
        csv = trtrepo_extras.csvdata:CSV

        [trtrepo.model_sources]
        mlp = trtrepo_extras.mlp:MLP
        """,
}

# The files each kind of plug-in touches (the package's METADATA aside): its own and the entry points.
TOUCHED = {
    "calibration method": ["trtrepo_extras/p90.py", ENTRY_POINTS],
    "Triton backend": ["trtrepo_extras/openvino.py", "trtrepo_extras/openvino.pbtxt.j2", ENTRY_POINTS],
    "Q/DQ target": ["trtrepo_extras/ortlite.py", ENTRY_POINTS],
    "built-in model": ["trtrepo_extras/tiny.py", ENTRY_POINTS],
    "data source kind": ["trtrepo_extras/csvdata.py", ENTRY_POINTS],
    "model source kind": ["trtrepo_extras/mlp.py", ENTRY_POINTS],
}


def _write_package(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(textwrap.dedent(text).lstrip())
    return root


@pytest.fixture(scope="module")
def plugin_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _write_package(tmp_path_factory.mktemp("site"), PLUGIN_FILES)


def _env(site: Path) -> dict[str, str]:
    import os

    paths = [str(site), str(ROOT), os.environ.get("PYTHONPATH", "")]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in paths if p)}


def _cli(site: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """The real ``trtrepo`` entry point in a child interpreter that has the plug-in installed."""
    return subprocess.run([sys.executable, "-c", "from trtrepo.cli import main; main()", *args], cwd=cwd, env=_env(site), capture_output=True,
                          text=True, timeout=600)


HELPS = textwrap.dedent("""
    import json, sys
    from click.testing import CliRunner
    from trtrepo.cli import cli
    out = {" ".join(a): CliRunner().invoke(cli, [*a, "--help"]).output
           for a in (["calibrate"], ["quantize"], ["deploy"], ["repo", "add"], ["export"], ["validate"])}
    print(json.dumps(out))
""")


def test_where_to_add_counts_are_the_plugin_files() -> None:
    """docs/architecture.md states, for each kind, the number of files a new one touches; the
    plug-in package of these tests touches exactly that many."""
    import re

    text = (ROOT / "docs" / "architecture.md").read_text()
    section = text[text.index("## Where to add"):]
    for kind, files in TOUCHED.items():
        m = re.search(rf"\*\*An? {re.escape(kind)}\*\* \((\d+) files\)", section)
        assert m is not None, f"docs/architecture.md: no file count for {kind}"
        assert int(m.group(1)) == len(files) == len(set(files)), kind
        assert all(f in PLUGIN_FILES for f in files)


@pytest.mark.long  # the README command's 6-minute budget; .ci/run runs the long tier
def test_plugin_package_adds_each_kind_end_to_end(tmp_path: Path, plugin_path: Path, demo_onnx: Path) -> None:
    import onnx
    import onnxruntime as ort

    from trtrepo.contracts import backends, builtin
    from trtrepo.qdq import target_names
    from trtrepo.tritonconfig import parse_config_text

    # nothing registered in this process: the plug-in exists only on the children's path
    assert "p90" not in H.METHODS and "openvino" not in backends.options() and "ortlite" not in target_names()
    assert "tiny" not in builtin.names()

    # every choice: --method, --backend, --target and the built-in names
    helps = subprocess.run([sys.executable, "-c", HELPS], cwd=tmp_path, env=_env(plugin_path), capture_output=True,
                           text=True, timeout=600)
    assert helps.returncode == 0, helps.stderr[-2000:]
    text = json.loads(helps.stdout)
    for command in ("calibrate", "quantize", "deploy"):
        assert "p90" in text[command], f"{command} --help does not offer the plug-in's method"
    for command in ("deploy", "repo add"):
        assert "openvino" in text[command], f"{command} --help does not offer the plug-in's backend"
    for command in ("quantize", "deploy"):
        assert "ortlite" in text[command], f"{command} --help does not offer the plug-in's Q/DQ target"
    assert "weighted ops only" in text["quantize"]
    for command in ("export", "validate"):
        assert "tiny" in text[command], f"{command} --help does not list the plug-in's built-in model"

    # the method: calibrate computes its ranges, its cache names its algorithm
    proc = _cli(plugin_path, tmp_path, "calibrate", str(demo_onnx), "--data", "demo:calib", "--limit", "128",
                "--method", "p90", "--ranges", "p90.json", "--cache", "p90.cache")
    assert proc.returncode == 0, proc.stderr[-2000:]
    ours = json.loads((tmp_path / "p90.json").read_text())
    assert ours["method"] == "p90"
    tensors = ours["tensors"]
    clipped = [t for t in tensors.values() if t["amax"] < t["histogram"]["max_abs"]]  # minmax's range is max_abs
    assert len(clipped) >= len(tensors) // 2, "a 90th-percentile range should clip most tensors"
    assert all(t["histogram"]["clipped_fraction"] > 0 for t in clipped)
    assert (tmp_path / "p90.cache").read_text().splitlines()[0].endswith("MinMaxCalibration")

    # the target (and the method among auto's candidates): Q/DQ in front of the weighted ops only,
    # uint8 activations, int8 weight initializers; ONNX Runtime runs it close to FP32
    proc = _cli(plugin_path, tmp_path, "quantize", str(demo_onnx), "--data", "demo:calib", "--limit", "128",
                "--target", "ortlite", "-o", "q.onnx", "--report", "rep", "--weight-rounding", "nearest")
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads((tmp_path / "rep" / "quantize.json").read_text())
    assert [m["label"] for m in report["methods"]] == [*H.METHODS, "p90"]
    assert report["target"] == "ortlite" and "p90" in proc.stdout
    model = onnx.load(tmp_path / "q.onnx")
    inits = {i.name: i for i in model.graph.initializer}
    consumers = {n.op_type for q in model.graph.node if q.op_type == "QuantizeLinear"
                 for dq in model.graph.node if dq.op_type == "DequantizeLinear" and dq.input[0] == q.output[0]
                 for n in model.graph.node if dq.output[0] in n.input}
    assert consumers and consumers <= {"Conv", "ConvTranspose", "Gemm", "MatMul"}, consumers
    zero_points = [inits[q.input[2]].data_type for q in model.graph.node if q.op_type == "QuantizeLinear"]
    assert set(zero_points) == {onnx.TensorProto.UINT8}
    weight_dqs = [n for n in model.graph.node if n.op_type == "DequantizeLinear" and n.input[0] in inits]
    assert weight_dqs and all(inits[n.input[0]].data_type == onnx.TensorProto.INT8 for n in weight_dqs)
    from trtrepo.demo import open_split

    x = open_split("val").arrays["input"][:64]
    fp32 = ort.InferenceSession(str(demo_onnx), providers=["CPUExecutionProvider"]).run(None, {"input": x})[0]
    int8 = ort.InferenceSession(str(tmp_path / "q.onnx"), providers=["CPUExecutionProvider"]).run(None, {"input": x})[0]
    assert (fp32.argmax(1) == int8.argmax(1)).mean() >= 0.9

    # the built-in model: export NAME
    proc = _cli(plugin_path, tmp_path, "export", "tiny", "-o", "tiny.onnx")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "verified against PyTorch" in proc.stdout
    assert [i.name for i in onnx.load(tmp_path / "tiny.onnx").graph.input] == ["x"]

    # the backend, end to end: deploy the plug-in's model (its calib data) with the plug-in's method to
    # the plug-in's backend, whose INT8 model is placed by the plug-in's target, in the plug-in's template
    proc = _cli(plugin_path, tmp_path, "deploy", "tiny", "--repo", "repo", "--backend", "openvino", "--method", "p90",
                "--weight-rounding", "nearest", "--accept-accuracy-loss")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "openvino_onnx" in proc.stdout  # the summary names the registered kind
    text = (tmp_path / "repo" / "tiny" / "config.pbtxt").read_text()
    config = parse_config_text(text, "config.pbtxt")  # Triton's own protobuf
    assert config.backend == "openvino" and not config.platform and "OpenVINO model" in text
    assert sorted(p.name for p in (tmp_path / "repo" / "tiny" / "1").iterdir()) == ["model.onnx"]
    deployed = onnx.load(tmp_path / "repo" / "tiny" / "1" / "model.onnx")
    ops = [n.op_type for n in deployed.graph.node]
    assert ops.count("QuantizeLinear") == 2 and "Relu" in ops  # the two Gemm inputs: ortlite's rule, not node units
    session = ort.InferenceSession(deployed.SerializeToString(), providers=["CPUExecutionProvider"])
    assert session.run(None, {"x": np.ones((2, 8), np.float32)})[0].shape == (2, 3)


def test_plugin_data_source_kind_feeds_calibrate(tmp_path: Path, plugin_path: Path, demo_onnx: Path) -> None:
    """A data source kind from the plug-in (CSV rows): ``--data rows.csv`` calibrates to the very
    ranges the same rows give as a ``.npy``; without the plug-in the spec is refused."""
    from click.testing import CliRunner

    from trtrepo.cli import cli
    from trtrepo.data import DATA_SOURCES, open_data
    from trtrepo.demo import open_split
    from trtrepo.errors import UsageError
    from trtrepo.modelio import ModelIO

    assert "csv" not in DATA_SOURCES  # the plug-in exists only on the children's path
    x = open_split("calib").arrays["input"][:48]
    np.savetxt(tmp_path / "rows.csv", x.reshape(len(x), -1), delimiter=",")
    np.save(tmp_path / "rows.npy", x)
    with pytest.raises(UsageError, match="unsupported data file type '.csv'"):
        open_data(str(tmp_path / "rows.csv"), io=ModelIO.from_onnx(demo_onnx))

    proc = _cli(plugin_path, tmp_path, "calibrate", str(demo_onnx), "--data", "rows.csv", "--method", "minmax",
                "--ranges", "csv.json")
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = CliRunner().invoke(cli, ["calibrate", str(demo_onnx), "--data", str(tmp_path / "rows.npy"), "--method",
                                      "minmax", "--ranges", str(tmp_path / "npy.json")])
    assert result.exit_code == 0, result.output
    ours, theirs = (json.loads((tmp_path / f).read_text())["tensors"] for f in ("csv.json", "npy.json"))
    assert ours.keys() == theirs.keys() and len(ours) > 3
    assert {k: v["amax"] for k, v in ours.items()} == {k: v["amax"] for k, v in theirs.items()}


def test_plugin_model_source_kind_exports(tmp_path: Path, plugin_path: Path) -> None:
    """A model source kind from the plug-in (``mlp://IN-HIDDEN-OUT``): resolved, keyed for the
    reference cache by its record and exported by the real CLI; without the plug-in the spec is
    refused."""
    import onnx
    import onnxruntime as ort

    from trtrepo.errors import UsageError
    from trtrepo.modelsource import MODEL_SOURCES, resolve_source

    assert "mlp" not in MODEL_SOURCES  # the plug-in exists only on the children's path
    with pytest.raises(UsageError, match="model not found"):
        resolve_source("mlp://8-16-3")
    probe = ("from trtrepo.modelsource import resolve_source, source_files_key; s = resolve_source('mlp://8-16-3'); "
             "print(s.kind, source_files_key(s))")
    proc = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, env=_env(plugin_path), capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == ["mlp", "mlp://8-16-3"]

    proc = _cli(plugin_path, tmp_path, "export", "mlp://8-16-3", "-o", "mlp.onnx", "--input-shape", "x:8")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "verified against PyTorch" in proc.stdout
    assert [i.name for i in onnx.load(tmp_path / "mlp.onnx").graph.input] == ["x"]
    session = ort.InferenceSession(str(tmp_path / "mlp.onnx"), providers=["CPUExecutionProvider"])
    assert session.run(None, {"x": np.ones((2, 8), np.float32)})[0].shape == (2, 3)


def test_broken_plugin_is_one_line_naming_its_entry_point(tmp_path: Path) -> None:
    site = _write_package(tmp_path / "site", {
        "trtrepo_broken/bad.py": "raise ImportError('needs libfoo')\n",
        "trtrepo_broken/wrong.py": "NOT_A_METHOD = 3\n",
        "trtrepo_broken-0.1.dist-info/METADATA": "Metadata-Version: 2.1\nName: trtrepo-broken\nVersion: 0.1\n",
        "trtrepo_broken-0.1.dist-info/entry_points.txt": "[trtrepo.calibration_methods]\nbad = trtrepo_broken.bad:M\n",
    })
    proc = _cli(site, tmp_path, "calibrate", "--help")
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines() == [
        "error: plug-in entry point 'bad = trtrepo_broken.bad:M' in group trtrepo.calibration_methods (from "
        "trtrepo-broken 0.1) failed to load: ImportError: needs libfoo"]
    (site / "trtrepo_broken-0.1.dist-info/entry_points.txt").write_text(
        "[trtrepo.qdq_targets]\nwrong = trtrepo_broken.wrong:NOT_A_METHOD\n")
    proc = _cli(site, tmp_path, "quantize", "--help")
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines() == [
        "error: plug-in entry point 'wrong = trtrepo_broken.wrong:NOT_A_METHOD' in group trtrepo.qdq_targets (from "
        "trtrepo-broken 0.1) names an object of type int, not a QdqTarget"]
