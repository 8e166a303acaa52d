"""``trtrepo export``."""

from __future__ import annotations

from typing import Any

import click

from ..contracts import builtin
from ..errors import UsageError
from ._inputs import io_paths


def _parse_dynamic(values: tuple[str, ...]) -> dict[str, dict[int, str]]:
    result: dict[str, dict[int, str]] = {}
    for v in values:
        parts = v.split(":")
        if len(parts) not in (2, 3) or not parts[1].isdigit():
            raise UsageError(f"--dynamic-axis '{v}': expected NAME:AXIS or NAME:AXIS:LABEL")
        result.setdefault(parts[0], {})[int(parts[1])] = parts[2] if len(parts) == 3 else f"{parts[0]}_dim{parts[1]}"
    return result


@click.command("export", help=f"""Export SOURCE to ONNX with a dynamic batch axis and check it against PyTorch.

    SOURCE is a built-in model ({', '.join(builtin.names())}), an .onnx file (checked and copied),
    a TorchScript file, 'package.module:factory' (with --weights), or a torchvision architecture
    (with --weights).
    """)
@click.argument("source")
@click.option("-o", "--output", type=click.Path(dir_okay=False), required=True, help="Output ONNX file.")
@click.option("--weights", type=click.Path(dir_okay=False), default=None, help="State dict for an entry point or torchvision architecture.")
@click.option("--input-shape", "input_shapes", multiple=True, metavar="[NAME:]DIMS",
              help="Per-sample input shape without the batch axis, e.g. 3x224x224 (repeat for several inputs).")
@click.option("--data", "data_spec", default=None, metavar="SPEC",
              help="Read the input names, shapes and dtypes off this data (an image folder, .npy/.npz, module:callable) "
                   "instead of --input-shape; axes whose size varies become dynamic.")
@click.option("--preprocess", type=click.Path(exists=True, dir_okay=False), default=None,
              help="Preprocessing spec for an image-folder --data.")
@click.option("--input-dtype", "input_dtypes", multiple=True, metavar="NAME:DTYPE", help="Input dtype (default float32).")
@click.option("--input-names", default=None, help="Comma-separated input names (default: input, or input0,input1,...).")
@click.option("--output-names", default=None, help="Comma-separated output names (default: output, or output0,...).")
@click.option("--dynamic-axis", "dynamic_axes", multiple=True, metavar="NAME:AXIS[:LABEL]", help="Extra dynamic axis (axis 0 is always dynamic).")
@click.option("--opset", type=click.IntRange(min=13), default=17, show_default=True)
@click.option("--force/--no-force", default=True, show_default=True, help="Overwrite an existing output file.")
@io_paths({"source": "SOURCE", "weights": "--weights", "data_spec": "--data", "preprocess": "--preprocess"},
          {"output": "-o"})
def command(source: str, output: str, weights: str | None, input_shapes: tuple[str, ...], data_spec: str | None,
            preprocess: str | None, input_dtypes: tuple[str, ...],
            input_names: str | None, output_names: str | None, dynamic_axes: tuple[str, ...], opset: int, force: bool) -> None:
    """Export SOURCE to ONNX (the help text is the command's ``help``: it lists the built-in models)."""
    from ..export import export_onnx, resolve_source  # noqa: PLC0415  # deferred: --help imports every command module; the stage loads only when the command runs

    src = resolve_source(source, weights)
    inputs = None
    axes = _parse_dynamic(dynamic_axes)
    if data_spec is not None and input_shapes:
        raise UsageError("give either --input-shape or --data (the shapes are read off the data)")
    if data_spec is not None:
        if not src.is_torch or builtin.builtin(src.kind) is not None:
            raise UsageError(f"--data does not apply to {source} (its inputs are known; the data only serves calibration)")
        inputs, axes = _inputs_from_data(data_spec, preprocess, axes)
    elif input_shapes:
        inputs = _inputs_from_shapes(input_shapes, input_names, input_dtypes)
    if input_names and not input_shapes and src.kind not in ("onnx",):
        if builtin.builtin(src.kind) is not None:
            raise UsageError(f"--input-names needs --input-shape (the {src.kind} model's inputs are fixed)")
        raise UsageError("--input-names needs --input-shape")
    result = export_onnx(
        src,
        output,
        inputs=inputs,
        output_names=output_names.split(",") if output_names else None,
        dynamic_axes=axes or None,
        opset=opset,
        force=force,
    )
    click.echo(f"exported {src.describe()} -> {result.path}")
    for t in result.io.inputs:
        click.echo(f"  input  {t.name}: {t.dtype} {list(t.shape)}")
    for t in result.io.outputs:
        click.echo(f"  output {t.name}: {t.dtype} {list(t.shape)}")
    if result.max_abs_error is not None:
        click.echo(f"  verified against PyTorch on a batch of {result.checked_batch}: max abs error {result.max_abs_error:.3g}")
    for note in result.notes:
        click.echo(f"  {note}")


def _inputs_from_data(data_spec: str, preprocess: str | None,
                      axes: dict[str, dict[int, str]]) -> tuple[list[Any], dict[str, dict[int, str]]]:
    """The inputs read off the data; the axes whose size varies there become dynamic, under the
    ones --dynamic-axis names."""
    from ..data import open_data  # noqa: PLC0415  # deferred: --help imports every command module; the stage loads only when the command runs
    from ..export import inputs_from_data  # noqa: PLC0415  # deferred: --help imports every command module; the stage loads only when the command runs

    inputs, from_data = inputs_from_data(open_data(data_spec, preprocess=preprocess))
    return inputs, {**from_data, **{k: {**from_data.get(k, {}), **v} for k, v in axes.items()}}


def _inputs_from_shapes(input_shapes: tuple[str, ...], input_names: str | None,
                        input_dtypes: tuple[str, ...]) -> list[Any]:
    """One input per --input-shape. Decision: its name is the --input-names entry, else the one
    the shape gives, else ``input`` (one input) or ``inputN``; its dtype --input-dtype's, else float32."""
    from ..export import InputShape, parse_input_shape  # noqa: PLC0415  # deferred: --help imports every command module; the stage loads only when the command runs

    parsed = [parse_input_shape(s) for s in input_shapes]
    names = input_names.split(",") if input_names else None
    if names is not None and len(names) != len(parsed):
        raise UsageError(f"--input-names lists {len(names)} names but {len(parsed)} --input-shape were given")
    dtypes = dict(d.split(":", 1) for d in input_dtypes) if input_dtypes else {}
    inputs = []
    for i, (pname, shape) in enumerate(parsed):
        name = (names[i] if names else pname) or ("input" if len(parsed) == 1 else f"input{i}")
        inputs.append(InputShape(name, shape, dtypes.get(name, "float32"), given=input_shapes[i]))
    return inputs
