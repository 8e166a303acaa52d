"""``trtrepo tune``."""

from __future__ import annotations

import click

from ..contracts.location import is_remote
from ..errors import UsageError
from ._inputs import io_paths
from ._options import data_options
from ._output import json_option, summary_output


@click.command("tune")
@click.argument("repo", type=click.Path(file_okay=False), default="model_repository")
@click.option("--model", required=True, help="Model in REPO to tune (not an ensemble: the model behind it).")
@data_options(required=True, batch_size=1)
@click.option("--concurrency", type=click.IntRange(1, 1024), default=8, show_default=True,
              help="Requests in flight while each candidate is measured.")
@click.option("--objective", type=click.Choice(["throughput", "latency"]), default="throughput", show_default=True,
              help="throughput: the most inferences/s within --max-p99-ms; latency: the lowest p99.")
@click.option("--max-p99-ms", type=click.FloatRange(min=0, min_open=True), default=None,
              help="p99 budget: candidates above it are not chosen.")
@click.option("--exhaustive", is_flag=True, help="Measure the whole grid instead of the quick coordinate search.")
@click.option("--budget-s", type=click.FloatRange(min=0, min_open=True), default=600.0, show_default=True,
              help="Stop searching after this many seconds (the best so far is chosen).")
@click.option("--measurement-interval", type=click.FloatRange(min=0, min_open=True), default=1.0, show_default=True,
              help="Seconds per measurement window of each candidate.")
@click.option("--stability-percentage", type=click.FloatRange(min=0, max=100, min_open=True), default=10.0,
              show_default=True, help="Three windows must agree within this.")
@click.option("--max-trials", type=click.IntRange(min=3), default=6, show_default=True, help="Windows per candidate at most.")
@click.option("--cores", type=click.IntRange(min=1), default=None,
              help="Cores of the serving machine (default: those available here, where the server runs).")
@click.option("--server-binary", type=click.Path(dir_okay=False), default=None, help="tritonserver to run.")
@click.option("--apply", is_flag=True, help="Write the chosen config as the model's config.pbtxt (atomically).")
@click.option("--report", "report_dir", type=click.Path(file_okay=False), default=None,
              help="Write tune.json, tune.md and tune.png (throughput vs p99 per candidate) into DIR.")
@json_option
@io_paths({"data_spec": "--data", "preprocess": "--preprocess", "labels": "--labels"}, {"report_dir": "--report"})
def command(repo: str, model: str, data_spec: str, preprocess: str | None, labels: str | None, limit: int | None,
            seed: int, batch_size: int, skip_non_images: bool, concurrency: int, objective: str, max_p99_ms: float | None, exhaustive: bool,
            budget_s: float, measurement_interval: float, stability_percentage: float, max_trials: int,
            cores: int | None, server_binary: str | None, apply: bool, report_dir: str | None, as_json: bool) -> None:
    """Search MODEL's serving config on a tritonserver started here: instance count x ONNX Runtime
    threads x dynamic batching (queue delay) x max batch size, each candidate loaded through the
    model-control API (explicit mode, no restart) and measured until stable at --concurrency.

    Prints the chosen config and its gain over the current one; --apply writes it into REPO.
    Exit 0 on success, 1 when no candidate meets --max-p99-ms, 2 for usage errors.
    """
    from ..data import DataOptions  # noqa: PLC0415  # deferred: --help imports every command module; the stage loads only when the command runs
    from ..tune import TuneOptions, tune  # noqa: PLC0415  # deferred: --help imports every command module; the stage loads only when the command runs

    if is_remote(repo):
        raise UsageError(f"REPO {repo}: tune loads candidates into a tritonserver started here from a local folder; tune "
                         f"a local copy, then 'trtrepo repo add' the model to object storage")
    options = TuneOptions(model=model, concurrency=concurrency, objective=objective, max_p99_ms=max_p99_ms,
                          exhaustive=exhaustive, budget_s=budget_s, interval_s=measurement_interval,
                          stability_pct=stability_percentage, max_trials=max_trials, batch_size=batch_size,
                          cores=cores, server_binary=server_binary)
    with summary_output(as_json) as emit:
        data = DataOptions(spec=data_spec, preprocess=preprocess, labels=labels, limit=limit, seed=seed,
                           skip_non_images=skip_non_images)
        result = tune(repo, options, data=data, apply=apply, report_dir=report_dir, say=click.echo)
        a, b, which = result.decided()  # the figures the gain is computed from, all of one round
        click.echo(f"start:  {result.start.label()}: {a['throughput']:.1f} infer/s, p99 {a['p99_ms']:.2f} ms ({which})"
                   if not a.get("error") else f"start:  {result.start.label()}: failed ({a['error']})")
        gain = "" if result.gain is None else f" ({result.gain:.2f}x the start)"
        click.echo(f"chosen: {result.chosen.label()}: {b['throughput']:.1f} infer/s, p99 {b['p99_ms']:.2f} ms{gain}; "
                   f"{result.to_dict()['candidates_measured']} candidates ({len(result.results)} measurements) in "
                   f"{result.seconds:.0f} s"
                   + (" (budget ran out)" if result.out_of_budget else ""))
        if result.applied:
            click.echo(f"wrote {result.applied}")
        if report_dir is not None:
            click.echo(f"report: {result.files.get('markdown')}")
        emit({"command": "tune", **result.to_dict()})
