"""Templates: one golden file per template, schema round trip, overrides, strict undefined, quoting.

After an intended change, regenerate the golden files with ``python tests/test_templates.py --update-golden``
and review the diff; the test itself only compares.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trtrepo.contracts.backends import BACKENDS
from trtrepo.contracts.plan import PlanMetadata
from trtrepo.contracts.profile import ShapeRange
from trtrepo.errors import UsageError
from trtrepo.modelio import ModelIO, TensorSpec
from trtrepo.tritonconfig import (
    ModelOptions,
    config_from_io,
    config_to_dict,
    ensemble_config,
    parse_config_text,
    pbstr,
    preprocess_config,
    render_config,
    validate_config_text,
)

GOLDEN = Path(__file__).parent / "golden"
PLAN = PlanMetadata("10.3.0.26", ModelIO(inputs=(TensorSpec("input", "float32", (-1, 1, 32, 32)),),
                                          outputs=(TensorSpec("logits", "float32", (-1, 10)),)),
                    profiles=({"input": ShapeRange((1, 1, 32, 32), (8, 1, 32, 32), (16, 1, 32, 32))},))


def demo_io() -> ModelIO:
    return ModelIO(
        inputs=(TensorSpec("input", "float32", (-1, 1, 32, 32)),),
        outputs=(TensorSpec("logits", "float32", (-1, 10)),),
    )


def golden_configs():
    io = demo_io()
    plan = config_from_io("demo_plan", io, BACKENDS["tensorrt_plan"], ModelOptions(
        preferred_batch_sizes=(4, 8), max_queue_delay_us=200, cuda_graphs=True, warmup=True, has_labels=True,
        gpus=(0,), version_policy="latest:2", cc_model_filenames=(("8.0", "a100.plan"), ("9.0", "h100.plan")),
    ), plan=PLAN)
    ort = config_from_io("demo_ort", io, BACKENDS["onnxruntime_onnx"], ModelOptions(
        preferred_batch_sizes=(8,), instance_count=2, instance_kind="cpu", response_cache=True,
        parameters=(("note", 'say "hi"'),)))
    py = config_from_io("demo", io, BACKENDS["python_onnx"], ModelOptions(
        preferred_batch_sizes=(4, 8), has_labels=True, execution_env="/opt/pyenv", intra_op_threads=2))
    pre = preprocess_config("demo_preprocess", "IMAGE", io.inputs[0], py.max_batch_size, ModelOptions(execution_env="/opt/pyenv"))
    ens = ensemble_config("demo_ensemble", "IMAGE", pre, py)
    return {"tensorrt_plan": plan, "onnxruntime": ort, "python_onnx": py, "python_preprocess": pre, "ensemble": ens}


@pytest.mark.parametrize("which", ["tensorrt_plan", "onnxruntime", "python_onnx", "python_preprocess", "ensemble"])
def test_template_matches_golden_file(which):
    config = golden_configs()[which]
    text = render_config(config)
    path = GOLDEN / f"{which}.pbtxt"
    assert path.is_file(), f"{path} is missing; write it with python tests/test_templates.py --update-golden"
    assert text == path.read_text(), f"{path} differs; if intended: python tests/test_templates.py --update-golden"


@pytest.mark.parametrize("which", ["tensorrt_plan", "onnxruntime", "python_onnx", "python_preprocess"])
def test_rendered_config_round_trips_through_model_config_proto(which):
    config = golden_configs()[which]
    msg = parse_config_text(render_config(config), which)
    d = config_to_dict(msg)
    assert d["name"] == config.name
    assert int(d.get("max_batch_size", 0)) == config.max_batch_size
    assert [(t["name"], t["data_type"], [int(x) for x in t["dims"]]) for t in d["input"]] == [
        (t.name, t.data_type, list(t.dims)) for t in config.inputs]
    assert [(t["name"], [int(x) for x in t["dims"]]) for t in d["output"]] == [(t.name, list(t.dims)) for t in config.outputs]
    if config.dynamic_batching:
        db = d["dynamic_batching"]
        assert [int(x) for x in db.get("preferred_batch_size", [])] == list(config.dynamic_batching.preferred_batch_sizes)
        assert int(db["max_queue_delay_microseconds"]) == config.dynamic_batching.max_queue_delay_us
    g = d["instance_group"][0]
    assert (g["kind"], int(g["count"])) == (config.instance_groups[0].kind, config.instance_groups[0].count)
    assert {k: v["string_value"] for k, v in d.get("parameters", {}).items()} == dict(config.parameters)


def test_plan_golden_passes_semantic_checks_with_profiles():
    config = golden_configs()["tensorrt_plan"]
    assert config.max_batch_size == 16  # from the profile's max batch
    validate_config_text(render_config(config), "demo_plan/config.pbtxt", io=demo_io(), plan=PLAN,
                         model_files=["labels.txt"])


def test_ensemble_golden_checks_step_models():
    cfgs = golden_configs()
    known = {c.name: parse_config_text(render_config(c), c.name) for c in (cfgs["python_onnx"], cfgs["python_preprocess"])}
    validate_config_text(render_config(cfgs["ensemble"]), "demo_ensemble", known_models=known)
    with pytest.raises(UsageError, match=r"step\[0\]\.model_name: model 'demo_preprocess' is not in the repository"):
        validate_config_text(render_config(cfgs["ensemble"]), "demo_ensemble", known_models={})


def test_user_template_dir_overrides_by_file_name(tmp_path):
    (tmp_path / "onnxruntime.pbtxt.j2").write_text(
        '{%- import "_macros.j2" as c -%}\n# my layout\n{{ c.header(m) }}\n{{- c.io(m) }}\n{{- c.instance_group(m) }}\n')
    text = render_config(golden_configs()["onnxruntime"], tmp_path)
    assert text.startswith("# my layout\n")
    assert "dynamic_batching" not in text
    parse_config_text(text, "override")
    # other templates still come from the package
    assert render_config(golden_configs()["python_onnx"], tmp_path) == render_config(golden_configs()["python_onnx"])


def test_undefined_template_variable_is_a_usage_error_naming_the_template(tmp_path):
    (tmp_path / "onnxruntime.pbtxt.j2").write_text("name: {{ m.name | pbstr }}\nmax_batch_size: {{ m.no_such_field }}\n")
    with pytest.raises(UsageError, match=r"template onnxruntime.pbtxt.j2.*no_such_field"):
        render_config(golden_configs()["onnxruntime"], tmp_path)


def test_template_override_with_unknown_field_fails_schema_check(tmp_path):
    (tmp_path / "onnxruntime.pbtxt.j2").write_text(
        '{%- import "_macros.j2" as c -%}\n{{ c.header(m) }}\n{{- c.io(m) }}\nmax_batchsize: 3\n')
    text = render_config(golden_configs()["onnxruntime"], tmp_path)
    with pytest.raises(UsageError, match=r"demo_ort/config.pbtxt: not a valid Triton ModelConfig: .*max_batchsize"):
        validate_config_text(text, "demo_ort/config.pbtxt")


@settings(max_examples=60, deadline=None)
@given(st.text(max_size=40))
def test_pbstr_round_trips_any_string_through_text_format(value):
    msg = parse_config_text(f'name: "m"\nparameters {{ key: "k" value: {{ string_value: {pbstr(value)} }} }}\n', "pbstr")
    assert msg.parameters["k"].string_value == value


def update_golden() -> None:
    """Write the golden files from the current templates (then review the diff)."""
    for which, config in golden_configs().items():
        path = GOLDEN / f"{which}.pbtxt"
        path.parent.mkdir(exist_ok=True)
        path.write_text(render_config(config))
        print(f"wrote {path}")


if __name__ == "__main__":
    import sys

    if sys.argv[1:] != ["--update-golden"]:
        raise SystemExit("usage: python tests/test_templates.py --update-golden")
    update_golden()


def test_python_onnx_threads_default_to_the_cores_shared_by_the_instances(caplog):
    """Issue 17 item 2: intra-op threads were 1 whatever the machine; now cores // instances (at
    least 1), with a warning when an explicit choice oversubscribes the cores."""
    from trtrepo.contracts.backends import machine_threads
    from trtrepo.cpu import available_cores

    cores = available_cores()
    assert machine_threads(1, 2) == 2 and machine_threads(3, 8) == 2 and machine_threads(4, 2) == 1

    def threads(**kw):
        msg = parse_config_text(render_config(config_from_io("m", demo_io(), BACKENDS["python_onnx"], ModelOptions(**kw))), "m")
        return int(msg.parameters["intra_op_threads"].string_value)

    assert threads() == cores
    assert threads(instance_count=2) == max(1, cores // 2)
    assert threads(intra_op_threads=1) == 1
    caplog.clear()
    with caplog.at_level("WARNING", logger="trtrepo.tritonconfig"):
        threads(instance_count=2, intra_op_threads=cores)
    assert "oversubscribed" in caplog.text
