"""One owner of the batch range (issue 14): trtrepo.contracts.profile.BatchProfile, made from
build's or deploy's flags, completed from data, read by the TensorRT profile and Triton's
max_batch_size; the deploy batch-range bugs of issue 14 as regression tests."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from trtrepo.cli import cli
from trtrepo.contracts.profile import BatchProfile, ShapeRange
from trtrepo.deploy import DeployOptions, build_options
from trtrepo.errors import OptionError, UsageError
from trtrepo.modelio import ModelIO, TensorSpec
from trtrepo.tritonconfig import ModelOptions, parse_config_text

# the flags of build's and deploy's batch settings (trtrepo/cli.py maps an OptionError's settings so)
BUILD = {"min_batch": "--min-batch", "opt_batch": "--opt-batch", "max_batch": "--max-batch", "shapes": "--shape"}
DEPLOY = {"max_batch_size": "--max-batch-size", "shapes": "--shape"}


def bert_io() -> ModelIO:
    ins = tuple(TensorSpec(n, "int64", (-1, -1), 0, ("batch", "sequence")) for n in ("input_ids", "attention_mask"))
    return ModelIO(inputs=ins, outputs=(TensorSpec("embedding", "float32", (-1, 8), 0),))


def image_io() -> ModelIO:
    return ModelIO(inputs=(TensorSpec("input", "float32", (-1, 1, 32, 32), 0),),
                   outputs=(TensorSpec("logits", "float32", (-1, 10), 0),))


def deploy_profile(max_batch_size: int | None, *shapes: str) -> BatchProfile:
    return build_options(DeployOptions(source="demo-text", shapes=shapes, model=ModelOptions(max_batch_size=max_batch_size)),
                         bert_io()).profile


# --- deploy -------------------------------------------------------------------------------------


def test_deploy_defaults_and_max_batch_size() -> None:
    assert BatchProfile.for_deploy(None).batch_range == (1, 8, 32)
    assert BatchProfile.for_deploy(64).batch_range == (1, 8, 64)
    assert BatchProfile.for_deploy(4).batch_range == (1, 4, 4)
    assert BatchProfile.for_deploy(64).triton_max_batch_size == 64


def test_deploy_batch_range_follows_shape_when_max_batch_size_is_not_given() -> None:
    profile = deploy_profile(None, "input_ids:2x8,16x64,64x128")
    assert profile.batch_range == (2, 16, 64) and profile.triton_max_batch_size == 64
    resolved = profile.resolve(bert_io())
    assert resolved["attention_mask"] == ShapeRange((2, 8), (16, 64), (64, 128))  # the shared axes follow


def test_deploy_max_batch_size_and_shape_must_agree_and_the_error_names_deploys_flags() -> None:
    """Issue 14: 'deploy --max-batch-size 64 --shape input_ids:1x8,8x16,32x32' blamed
    --min/--opt/--max-batch, options deploy does not have."""
    with pytest.raises(OptionError) as err:
        deploy_profile(64, "input_ids:1x8,8x16,32x32")
    assert "the max batch size 64" in err.value.message and "the shape range input_ids" in err.value.message
    message = err.value.with_flags(DEPLOY)
    assert "--max-batch-size 64" in message and "--shape input_ids" in message
    assert "--min" not in message and "--opt" not in message
    ok = deploy_profile(32, "input_ids:1x8,8x16,32x32")
    assert ok.batch_range == (1, 8, 32)


def test_deploy_shapes_must_share_one_batch_range() -> None:
    with pytest.raises(UsageError, match="batch axis.*differs between inputs"):
        deploy_profile(None, "input_ids:1x8,8x16,32x32", "attention_mask:1x8,8x16,16x32")


def test_max_batch_size_zero_is_no_batch_axis_never_32() -> None:
    """Issue 14: '--max-batch-size 0' silently built a 1..32 plan ('0 or 32')."""
    profile = BatchProfile.for_deploy(0)
    assert not profile.batched and profile.triton_max_batch_size == 0
    # a dynamic axis 0 is then an ordinary axis: no default range, the error says how to give one
    with pytest.raises(UsageError, match=r"the max batch size 0.*the shape range input:MIN,OPT,MAX"):
        profile.resolve(image_io())
    explicit = BatchProfile.for_deploy(0, ["input:1x1x32x32,4x1x32x32,16x1x32x32"]).resolve(image_io())
    assert explicit == {"input": ShapeRange((1, 1, 32, 32), (4, 1, 32, 32), (16, 1, 32, 32))}
    # a fixed-shape model needs nothing
    fixed = ModelIO(inputs=(TensorSpec("x", "float32", (1, 3), None),), outputs=(TensorSpec("y", "float32", (1, 2), None),))
    assert BatchProfile.for_deploy(0).resolve(fixed) == {}
    with pytest.raises(UsageError, match="the max batch size 8: the model has no dynamic batch axis"):
        build_options(DeployOptions(model=ModelOptions(max_batch_size=8)), fixed)


def test_negative_max_batch_size_is_refused() -> None:
    with pytest.raises(UsageError, match="the max batch size -1"):
        BatchProfile.for_deploy(-1)


def test_deploy_cli_refuses_conflicting_batch_flags_before_any_work(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    result = CliRunner().invoke(cli, ["deploy", "demo-text", "--repo", str(repo), "--workdir", str(tmp_path / "w"),
                                      "--max-batch-size", "64", "--shape", "input_ids:1x8,8x16,32x32"])
    assert result.exit_code == 2, result.output
    assert "--max-batch-size 64" in result.output and "--min/--opt/--max-batch" not in result.output
    assert not repo.exists() and not (tmp_path / "w").exists()


@pytest.mark.parametrize(("shape", "message"), [
    ("bogus:1x1x32x32", "error: --shape names unknown input(s) bogus (inputs: input)"),
    ("input:1x3x24x24", "error: --shape input:1x3x24x24,1x3x24x24,1x3x24x24: axis 1 is fixed at 1 in the model"),
    ("input:1x32x32", "error: --shape input: rank 3 but the input has shape [-1, 1, 32, 32]"),
])
def test_deploy_refuses_a_shape_the_model_cannot_take_whatever_the_backend(tmp_path: Path, shape: str,
                                                                          message: str) -> None:
    """Issue 27: a --shape naming an unknown input, or not fitting it, is a usage error even where
    backend auto picks one that builds no engine; nothing is written."""
    repo = tmp_path / "repo"
    result = CliRunner().invoke(cli, ["deploy", "demo", "--repo", str(repo), "--precision", "fp32", "--shape", shape])
    assert result.exit_code == 2, result.output
    assert result.stderr.strip() == message
    assert not repo.exists()


@pytest.mark.parametrize("backend", ["python", "onnxruntime"])
def test_deploy_refuses_shapes_on_a_backend_that_builds_no_engine(tmp_path: Path, backend: str) -> None:
    repo = tmp_path / "repo"
    result = CliRunner().invoke(cli, ["deploy", "demo", "--repo", str(repo), "--backend", backend, "--precision", "fp32",
                                      "--shape", "input:1x1x32x32,4x1x32x32,16x1x32x32"])
    assert result.exit_code == 2, result.output
    assert result.stderr.strip() == (f"error: --shape: the {backend} backend builds no TensorRT engine, so the shapes are "
                                     "not used; drop them (--max-batch-size sets Triton's batch range)")
    assert not repo.exists()


def test_deploy_warns_when_backend_auto_leaves_the_shapes_unused(tmp_path: Path) -> None:
    from trtrepo.engine import tensorrt_status

    if tensorrt_status().available:
        pytest.skip("TensorRT is installed: backend auto builds an engine here")
    repo = tmp_path / "repo"
    result = CliRunner().invoke(cli, ["deploy", "demo", "--repo", str(repo), "--precision", "fp32",
                                      "--shape", "input:1x1x32x32,8x1x32x32,32x1x32x32"])
    assert result.exit_code == 0, result.output
    assert "warning: --shape: the python backend builds no TensorRT engine, so the shapes are not used (backend auto " \
           "chose python on this machine)" in result.stderr


def test_deploy_max_batch_size_zero_writes_a_config_without_batching(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    result = CliRunner().invoke(cli, ["deploy", "demo", "--repo", str(repo), "--backend", "onnxruntime",
                                      "--precision", "fp32", "--max-batch-size", "0"])
    assert result.exit_code == 0, result.output
    config = parse_config_text((repo / "demo" / "config.pbtxt").read_text(), "config.pbtxt")
    assert config.max_batch_size == 0
    assert list(config.input[0].dims) == [-1, 1, 32, 32]  # axis 0 is part of the shape, not Triton's batch
    assert not config.HasField("dynamic_batching")


# --- build ---------------------------------------------------------------------------------------


def test_build_errors_name_builds_flags() -> None:
    with pytest.raises(OptionError, match=r"\(the min/opt/max batch\)") as err:
        BatchProfile.for_build(4, 2, 8)
    assert err.value.with_flags(BUILD).endswith("(--min-batch/--opt-batch/--max-batch)")
    profile = BatchProfile.for_build(shapes=["input_ids:2x8,8x64,32x128"])
    with pytest.raises(OptionError, match="batch axis 2,8,32 differs from the min/opt/max batch 1,8,32") as err:
        profile.resolve(bert_io())
    assert "batch axis 2,8,32 differs from --min-batch/--opt-batch/--max-batch 1,8,32" in err.value.with_flags(BUILD)


def test_data_shapes_keep_given_shapes_and_the_batch_range() -> None:
    from trtrepo.data import Sample

    samples = [Sample({"input_ids": [1] * n, "attention_mask": [1] * n}) for n in (8, 16, 16, 40)]
    profile = BatchProfile.for_deploy(16).with_data_shapes(bert_io(), samples)
    shapes = dict(profile.shapes)
    assert shapes["input_ids"] == ShapeRange((1, 8), (8, 16), (16, 40))
    kept = BatchProfile.for_deploy(16, ["input_ids:1x4,8x8,16x64"]).with_data_shapes(bert_io(), samples)
    assert dict(kept.shapes)["input_ids"] == ShapeRange((1, 4), (8, 8), (16, 64))
