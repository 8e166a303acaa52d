"""``trtrepo preprocess``: write a preprocessing spec file."""

from __future__ import annotations

import math

import click

from ..errors import UsageError


def _floats(text: str | None, option: str) -> tuple[float, ...] | None:
    if text is None:
        return None
    try:
        values = tuple(float(v) for v in text.split(","))
    except ValueError:
        raise UsageError(f"{option} {text!r}: expected comma-separated numbers, e.g. 0.485,0.456,0.406") from None
    if not all(math.isfinite(v) for v in values):
        raise UsageError(f"{option} {text!r}: values must be finite numbers")
    return values


def _ints(text: str | None, option: str) -> tuple[int, ...] | None:
    if text is None:
        return None
    try:
        return tuple(int(v) for v in text.lower().replace("x", ",").split(","))
    except ValueError:
        raise UsageError(f"{option} {text!r}: expected HEIGHTxWIDTH or one size, e.g. 224x224 or 256") from None


@click.command("preprocess")
@click.option("-o", "--output", type=click.Path(dir_okay=False), required=True, help="Spec file (.json, .yaml).")
@click.option("--resize", default=None, help="Shorter side (256) or HxW (224x224).")
@click.option("--center-crop", default=None, help="Crop size (224 or 224x224).")
@click.option("--letterbox", default=None,
              help="Detector input: scale keeping the aspect ratio to fit HxW (640 or 640x640) and pad the rest "
                   "(excludes --resize and --center-crop).")
@click.option("--pad-value", type=click.IntRange(0, 255), default=114, show_default=True,
              help="Pixel value of the --letterbox padding (before --scale).")
@click.option("--interpolation", type=click.Choice(["nearest", "bilinear", "bicubic", "lanczos"]), default="bilinear", show_default=True)
@click.option("--color", type=click.Choice(["rgb", "bgr", "gray"]), default="rgb", show_default=True)
@click.option("--scale", type=float, default=1 / 255, show_default=True, help="Multiply pixel values by this first.")
@click.option("--mean", default="0", show_default=True, help="Comma-separated per-channel mean (after scaling).")
@click.option("--std", default="1", show_default=True, help="Comma-separated per-channel std.")
@click.option("--layout", type=click.Choice(["NCHW", "NHWC"]), default="NCHW", show_default=True)
@click.option("--dtype", type=click.Choice(["float32", "float16", "uint8", "int8"]), default="float32", show_default=True)
@click.option("--input-name", default=None, help="Model input the images feed (needed for multi-input models).")
@click.option("--demo", is_flag=True, help="Write the embedded demo model's spec (ignores the other options).")
def command(output: str, resize: str | None, center_crop: str | None, letterbox: str | None, pad_value: int,
            interpolation: str, color: str, scale: float, mean: str, std: str, layout: str, dtype: str,
            input_name: str | None, demo: bool) -> None:
    """Write the image preprocessing spec that calibration, evaluation and validation share."""
    from ..data import Preprocess  # noqa: PLC0415  # deferred: --help imports every command module; the stage loads only when the command runs

    if demo:
        from .. import demo as demo_mod  # noqa: PLC0415  # deferred: --help imports every command module; the stage loads only when the command runs

        spec = demo_mod.preprocess()
    else:
        spec = Preprocess(resize=_ints(resize, "--resize"), center_crop=_ints(center_crop, "--center-crop"), interpolation=interpolation,  # type: ignore[arg-type]
                          color=color, scale=scale, mean=_floats(mean, "--mean") or (0.0,), std=_floats(std, "--std") or (1.0,),
                          layout=layout, dtype=dtype, input_name=input_name,
                          letterbox=_ints(letterbox, "--letterbox"), pad_value=pad_value)  # type: ignore[arg-type]
    path = spec.save(output)
    click.echo(f"wrote {path}")
