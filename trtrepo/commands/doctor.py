"""``trtrepo doctor``."""

from __future__ import annotations

import json

import click


@click.command("doctor")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def command(as_json: bool) -> None:
    """Report what is available here (ONNX Runtime providers, torch/CUDA, TensorRT, tritonclient,
    tritonserver) and so which stages can run."""
    from ..doctor import diagnose  # noqa: PLC0415  # deferred: --help imports every command module; the stage loads only when the command runs

    report = diagnose()
    if as_json:
        click.echo(json.dumps(report, indent=2))
        return
    for item in report["components"]:
        mark = "ok " if item["available"] else "-- "
        click.echo(f"{mark} {item['name']:<14} {item['detail']}")
    click.echo("")
    for stage, info in report["stages"].items():
        mark = "yes" if info["available"] else "no "
        click.echo(f"{mark} {stage:<10} {info['detail']}")
    if report["servers_removed"]:
        click.echo("")
        for text in report["servers_removed"]:
            click.echo(f"removed {text}")
    if report["leftovers"]:
        click.echo("")
        for path in report["leftovers"]:
            click.echo(f"left by a killed trtrepo process (the next run of its kind removes it): {path}")
