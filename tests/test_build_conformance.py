"""API conformance of the TensorRT adapter (trtrepo/engine/) against the REAL TensorRT 10.13 and 11.4 Python
bindings, loaded with stub libraries (scripts/setup_trt_bindings.sh). Each check runs in a subprocess
(tests/_trt_conformance.py): the two versions cannot share one process.

What is checked is what the code touches on each route, recorded through a proxy (see
tests/_trt_conformance.py), not a hand-written list. Nothing here builds an engine.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
BINDINGS = Path(os.environ.get("TRT_BINDINGS_DIR", ROOT / ".trt-bindings"))
RUNNER = Path(__file__).resolve().parent / "_trt_conformance.py"
MAJORS = (10, 11)


def _ready(major: int) -> bool:
    return (BINDINGS / str(major) / ".complete").is_file()


pytestmark = pytest.mark.skipif(
    not all(_ready(m) for m in MAJORS),
    reason=f"real TensorRT bindings not set up in {BINDINGS} (run scripts/setup_trt_bindings.sh)",
)


def _env(major: int) -> dict[str, str]:
    env = dict(os.environ)
    root = BINDINGS / str(major)
    env["LD_LIBRARY_PATH"] = os.pathsep.join(filter(None, [str(root / "lib"), env.get("LD_LIBRARY_PATH")]))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(root / "site"), str(ROOT), env.get("PYTHONPATH")]))
    return env


def _python(major: int, code: str) -> Any:
    proc = subprocess.run([sys.executable, "-c", code], env=_env(major), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from _build_models import demo_models, demo_text_models

    folder = tmp_path_factory.mktemp("conformance_models")
    demo_models(folder)
    demo_text_models(folder)
    return folder


def run_route(major: int, route: str, models: Path, mutate: tuple[str, str] | None = None) -> dict[str, Any]:
    cmd = [sys.executable, str(RUNNER), route, "--models", str(models)]
    if mutate:
        cmd += ["--mutate", *mutate]
    proc = subprocess.run(cmd, env=_env(major), capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["tensorrt"].startswith(f"{major}."), result["tensorrt"]
    return result


@pytest.mark.parametrize(("major", "route"), [
    (10, "qdq"), (11, "qdq"), (10, "legacy-entropy"), (10, "legacy-minmax-cache"),
])
def test_route_touches_only_what_the_real_bindings_have(major: int, route: str, models: Path) -> None:
    result = run_route(major, route, models)
    assert result["violations"] == []
    assert result["error"] is None, result.get("traceback")
    accessed = set(result["accessed"])
    # The route ran to its end: built, then read the IO back from the engine.
    assert {"Builder.build_serialized_network", "Runtime.deserialize_cuda_engine", "OnnxParser.parse_from_file",
            "IOptimizationProfile.set_shape", "ICudaEngine.get_tensor_profile_shape"} <= accessed
    if route.startswith("legacy"):
        base = "IInt8EntropyCalibrator2" if "entropy" in route else "IInt8MinMaxCalibrator"
        assert {"BuilderFlag.INT8", "IBuilderConfig.int8_calibrator", "IBuilderConfig.set_calibration_profile",
                f"{base}.__init__", f"{base}.get_batch (override)", f"{base}.read_calibration_cache (override)"} <= accessed
    else:
        assert not any("INT8" in a or "Calibrator" in a for a in accessed)
        assert ("NetworkDefinitionCreationFlag.STRONGLY_TYPED" in accessed) == (major == 10)


@pytest.mark.parametrize("route", ["legacy-entropy", "legacy-minmax-cache"])
def test_legacy_route_on_11_fails_before_touching_tensorrt(route: str, models: Path) -> None:
    result = run_route(11, route, models)
    assert result["violations"] == []
    assert result["error"].startswith("OptionError: the legacy calibrator needs TensorRT 8.6-10.x")
    assert "Q/DQ route" in result["error"]
    # Only the version and the logger (made when the adapter is created) were touched.
    assert {a for a in result["accessed"] if not a.startswith(("ILogger.", "tensorrt.ILogger"))} == {"tensorrt.__version__"}


@pytest.mark.parametrize("major", MAJORS)
def test_a_misspelled_attribute_is_caught(major: int, models: Path) -> None:
    result = run_route(major, "qdq", models, mutate=("config.set_memory_pool_limit(", "config.set_memory_pool_limt("))
    assert result["error"] == "conformance"
    assert result["violations"] == [f"IBuilderConfig.set_memory_pool_limt does not exist in TensorRT {result['tensorrt']}"]


@pytest.mark.parametrize("major", MAJORS)
def test_explicit_batch_is_caught_only_on_11(major: int, models: Path) -> None:
    result = run_route(major, "qdq", models, mutate=("if major >= 11:\n            flags = 0", "if major >= 99:\n            flags = 0"))
    assert result["violations"] == []  # STRONGLY_TYPED still exists in 11 (ignored there)
    result = run_route(major, "qdq", models, mutate=("NetworkDefinitionCreationFlag.STRONGLY_TYPED",
                                                     "NetworkDefinitionCreationFlag.EXPLICIT_BATCH"))
    if major == 11:
        assert result["violations"] == []  # that line is not reached on 11
    else:
        assert result["violations"] == [] and result["error"] is None  # EXPLICIT_BATCH exists (deprecated) in 10
    result = run_route(major, "qdq", models, mutate=("if major >= 11:\n            flags = 0\n        else:\n"
                                                     "            flags = 1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED)",
                                                     "flags = 1 << int(trt.NetworkDefinitionCreationFlag.EXPLICIT_BATCH)"))
    if major == 11:
        assert result["violations"] == ["NetworkDefinitionCreationFlag.EXPLICIT_BATCH does not exist in TensorRT 11.4.0.106"]
    else:
        assert result["violations"] == []


def test_wrong_arguments_are_caught(models: Path) -> None:
    swapped = run_route(10, "qdq", models, mutate=(
        "config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, int(options.workspace))",
        "config.set_memory_pool_limit(int(options.workspace), trt.MemoryPoolType.WORKSPACE)"))
    assert len(swapped["violations"]) == 1 and "'pool' expects tensorrt_bindings.tensorrt.MemoryPoolType, got int" in swapped["violations"][0]
    missing = run_route(11, "qdq", models, mutate=("config.set_timing_cache(cache, False)", "config.set_timing_cache(cache)"))
    assert "missing 'ignore_mismatch'" in missing["violations"][0]
    wrong_kind = run_route(11, "qdq", models, mutate=("config.builder_optimization_level = int(options.opt_level)",
                                                      "config.builder_optimization_level = str(options.opt_level)"))
    assert "expects typing.SupportsInt, got str" in wrong_kind["violations"][0]


def test_calibrator_override_with_wrong_arity_is_caught(models: Path) -> None:
    result = run_route(10, "legacy-entropy", models, mutate=("def get_batch(self, names: list[str])",
                                                             "def get_batch(self, names: list[str], stream=None)"))
    assert result["violations"] and "TrtrepoEntropyCalibrator.get_batch takes 3 parameters" in result["violations"][0]


FACTS = """
import json, tensorrt_bindings as t
print(json.dumps({
    "version": t.__version__,
    "IInt8EntropyCalibrator2": hasattr(t, "IInt8EntropyCalibrator2"),
    "IInt8MinMaxCalibrator": hasattr(t, "IInt8MinMaxCalibrator"),
    "BuilderFlag.INT8": "INT8" in t.BuilderFlag.__members__,
    "EXPLICIT_BATCH": "EXPLICIT_BATCH" in t.NetworkDefinitionCreationFlag.__members__,
    "STRONGLY_TYPED": "STRONGLY_TYPED" in t.NetworkDefinitionCreationFlag.__members__,
    "int8_calibrator": hasattr(t.IBuilderConfig, "int8_calibrator"),
    "set_calibration_profile": hasattr(t.IBuilderConfig, "set_calibration_profile"),
    "WORKSPACE": "WORKSPACE" in t.MemoryPoolType.__members__,
}))
"""


@pytest.mark.parametrize("major", MAJORS)
def test_version_facts_the_code_relies_on(major: int) -> None:
    facts = _python(major, FACTS)
    assert facts.pop("version").startswith(f"{major}.")
    assert facts.pop("STRONGLY_TYPED") and facts.pop("WORKSPACE")
    # TensorRT 11 removed implicit quantization; 10.13 still has it (deprecated).
    assert facts == {k: major == 10 for k in facts}


# ------------------------------------------------------------------------------------------------
# --fp16 (mixed INT8 + FP16) and several dynamic axes (issue 8)


@pytest.mark.parametrize(("major", "route"), [(10, "qdq-fp16"), (11, "qdq-fp16"), (10, "qdq-text-fp16"), (11, "qdq-text-fp16"),
                                              (10, "legacy-entropy-fp16")])
def test_fp16_routes_touch_only_what_the_real_bindings_have(major: int, route: str, models: Path) -> None:
    result = run_route(major, route, models)
    assert result["violations"] == []
    assert result["error"] is None, result.get("traceback")
    accessed = set(result["accessed"])
    assert {"Builder.build_serialized_network", "OnnxParser.parse_from_file", "IOptimizationProfile.set_shape",
            "ICudaEngine.get_tensor_dtype"} <= accessed
    if route.startswith("legacy"):
        assert {"BuilderFlag.FP16", "BuilderFlag.INT8", "IBuilderConfig.set_flag"} <= accessed
        assert result["result"]["route"] == "implicit-int8-calibrator+fp16-flag"
        assert "--int8 --fp16" in result["result"]["trtexec"]
        return
    # Q/DQ route: FP16 comes from the converted graph; no precision flag is touched on either version, and the
    # TensorRT API used is exactly the plain Q/DQ route's (the conversion is ONNX work before TensorRT).
    assert not any("FP16" in a or "INT8" in a or "set_flag" in a or "Calibrator" in a for a in accessed)
    plain = set(run_route(major, "qdq", models)["accessed"])
    assert accessed == plain
    assert result["result"]["route"] == "strongly-typed-qdq+fp16-onnx"
    assert result["result"]["precision"]["fp16"]["method"] == "onnx-conversion"
    assert ("--stronglyTyped" in result["result"]["trtexec"]) == (major == 10) and "--fp16" not in result["result"]["trtexec"]
    if route == "qdq-text-fp16":
        rng = {"min": [1, 8], "opt": [8, 64], "max": [32, 128]}
        assert result["result"]["profile"] == {"input_ids": rng, "attention_mask": rng}


def test_fp16_flag_on_a_strongly_typed_route_is_caught_on_11(models: Path) -> None:
    """Setting BuilderFlag.FP16 on the Q/DQ route would be caught by the bindings on 11 (the flag is gone)."""
    mutate = ("    config = builder.create_builder_config()\n",
              "    config = builder.create_builder_config()\n        config.set_flag(trt.BuilderFlag.FP16)\n")
    result = run_route(11, "qdq-fp16", models, mutate=mutate)
    assert result["violations"] == ["BuilderFlag.FP16 does not exist in TensorRT 11.4.0.106"]


FP16_FACTS = """
import json, tensorrt_bindings as t
print(json.dumps({
    "version": t.__version__,
    "BuilderFlag.FP16": "FP16" in t.BuilderFlag.__members__,
    "BuilderFlag.BF16": "BF16" in t.BuilderFlag.__members__,
    "OBEY_PRECISION_CONSTRAINTS": "OBEY_PRECISION_CONSTRAINTS" in t.BuilderFlag.__members__,
    "strongly_typed_forbids_layer_precision": "not allowed" in (t.NetworkDefinitionCreationFlag.__doc__ or ""),
    "DataType.HALF": "HALF" in t.DataType.__members__,
}))
"""


@pytest.mark.parametrize("major", MAJORS)
def test_fp16_version_facts(major: int) -> None:
    facts = _python(major, FP16_FACTS)
    assert facts.pop("version").startswith(f"{major}.")
    assert facts.pop("DataType.HALF")  # FP16 tensors exist in both: the converted graph's types
    # 10.13 documents that a strongly typed network takes no layer precisions; 11.4 has no precision flags at all.
    assert facts.pop("strongly_typed_forbids_layer_precision") == (major == 10)
    assert facts == {k: major == 10 for k in facts}
