"""``trtrepo validate``: a deployment gate against a running Triton server."""

from __future__ import annotations

import click

from ..contracts import builtin
from ..errors import TrtrepoError, UsageError
from ..measure import Stability, parse_percentiles, parse_rates
from ._inputs import io_paths
from ._options import data_options
from ._output import json_option, summary_output
from ._types import CONCURRENCY, SPEED_BATCH_SIZES


@click.command("validate")
@click.option("--url", default="", metavar="HOST:PORT[,HOST:PORT...]",
              help="Server address (default 127.0.0.1:8001 for grpc, 127.0.0.1:8000 for http). Several, comma-separated: "
                   "servers of one repository (a fleet): each gets every request of the accuracy phase (their outputs "
                   "are compared) and each level's load at the same time; the report has per-server and total figures.")
@click.option("--max-server-diff", type=click.FloatRange(min=0), default=1e-5, show_default=True,
              help="Several --url servers: largest absolute difference allowed between two servers' outputs for the "
                   "same request (exit 1 beyond it, naming server and output).")
@click.option("--protocol", type=click.Choice(["grpc", "http"]), default="grpc", show_default=True)
@click.option("--model", required=True, help="Model name on the server.")
@click.option("--version", "model_version", default="", help="Model version (default: the one the server serves).")
@click.option("--reference", required=True, metavar="SOURCE",
              help=f"The model to compare with: {', '.join(builtin.names())}, a TorchScript or .onnx file, package.module:factory.")
@click.option("--weights", type=click.Path(dir_okay=False), default=None, help="State dict for an entry-point reference.")
@click.option("--output-names", default=None, metavar="A,B",
              help="Names of a PyTorch reference's outputs, as given to 'deploy --output-names'.")
@click.option("--input-shape", "input_shapes", multiple=True, metavar="[NAME:]DIMS",
              help="Input shape of a PyTorch reference without the batch axis (repeat per input); default: read "
                   "off the --data samples.")
@click.option("--onnx", type=click.Path(dir_okay=False), default=None,
              help="The ONNX model that was deployed: the IO contract is read from it (default: from the reference).")
@click.option("--no-cache", "no_cache", is_flag=True, default=False,
              help="Export a PyTorch --reference afresh instead of reusing its cached export ($TRTREPO_CACHE_DIR/reference, "
                   "else ~/.cache/trtrepo/reference; keyed by the content of its source and weights files).")
@data_options(required=True, batch_size=1)
@click.option("--concurrency", type=CONCURRENCY, default="1,2,4,8,16", show_default=True, help="Requests in flight, per level.")
@click.option("--request-rate", "request_rate", default=None, metavar="R1,R2",
              help="Open loop instead of --concurrency: requests sent per second, per level, whether or not earlier "
                   "ones returned.")
@click.option("--request-distribution", type=click.Choice(["constant", "poisson"]), default="constant",
              show_default=True, help="Gaps between the requests of --request-rate.")
@click.option("--measurement-interval", "--duration", "measurement_interval", type=click.FloatRange(min=0, min_open=True),
              default=2.0, show_default=True,
              help="Seconds per measurement window; each level is measured in windows until three agree.")
@click.option("--requests", type=click.IntRange(min=1), default=None,
              help="Windows of this many requests instead of --measurement-interval seconds.")
@click.option("--stability-percentage", type=click.FloatRange(min=0, max=100, min_open=True), default=10.0,
              show_default=True, help="Three consecutive windows must agree within this on throughput and latency.")
@click.option("--max-trials", type=click.IntRange(min=3), default=10, show_default=True,
              help="Windows per level at most; a level that is not stable by then is reported as such.")
@click.option("--percentiles", default="50,90,95,99", show_default=True,
              help="Client latency percentiles reported (p50 and p99 always).")
@click.option("--stability-percentile", type=click.IntRange(1, 99), default=None,
              help="Compare this latency percentile across windows instead of the mean.")
@click.option("--warmup", type=click.IntRange(min=0), default=20, show_default=True, help="Warm-up requests per level.")
@click.option("--shared-memory", type=click.Choice(["none", "system", "cuda"]), default="none", show_default=True,
              help="Pass tensors through shared memory (cuda: GPU machines only).")
@click.option("--max-top1-drop", type=float, default=None, metavar="POINTS",
              help="Fail when the top-1 accuracy drop exceeds this: vs labels when there are labels, else the "
                   "expected top-1 drop under the reference's softmax, which must lie under it with 95 % confidence "
                   "(quantize's rule; too few samples to decide fail, naming how many would).")
@click.option("--min-cosine", type=float, default=None, help="Fail when an output's mean cosine similarity is lower.")
@click.option("--min-embedding-cosine", type=float, default=0.99, show_default=True,
              help="Fail when an output without classes (an embedding) has a lower mean cosine similarity: on by "
                   "default; -1 turns it off.")
@click.option("--min-map", type=float, default=None, metavar="MIN",
              help="A detector (a detection ensemble, or a model with a YOLO-style head output): fail when the "
                   "mAP50-95 of the served detections against the reference's is lower; the lower end of its 95 % "
                   "interval over the images is judged (the gate's map=MIN rule; 0.9 is the gate's default).")
@click.option("--max-map-drop", type=float, default=None, metavar="POINTS",
              help="A detector with box labels (--labels: COCO JSON or a YOLO txt folder): fail when the served "
                   "detections' mAP50-95 against the labels is lower than the reference's by more than this; the "
                   "upper end of the drop's paired 95 % interval is judged (the gate's rule with labels; 1 is its "
                   "default).")
@click.option("--max-p99-ms", type=float, default=None, help="Fail when the client p99 latency exceeds this at any level.")
@click.option("--timeout", type=click.FloatRange(min=0, min_open=True), default=10.0, show_default=True,
              help="Seconds each request (and each server call) may take.")
@click.option("--ready-timeout", type=click.FloatRange(min=0, min_open=True), default=None,
              help="Seconds to wait for the server and the model to become ready [default: 30; a refused connection "
                   "ends the wait after 3 s unless this is given: nothing listens there].")
@click.option("--label-output", default=None, metavar="NAME",
              help="Output the labels and --max-top1-drop apply to (default: the first [N, C] output).")
@click.option("--worst", type=click.IntRange(min=0), default=5, show_default=True, help="Worst samples listed per output.")
@click.option("--accuracy/--no-accuracy", default=True, show_default=True, help="Run the accuracy phase.")
@click.option("--latency/--no-latency", default=True, show_default=True, help="Run the latency/throughput phase.")
@click.option("--reference-speed/--no-reference-speed", default=True, show_default=True,
              help="Time the reference beside the served model per batch size (with the latency phase).")
@click.option("--speed-batch-sizes", type=SPEED_BATCH_SIZES, default="1,8,32", show_default=True,
              help="Batch sizes of the reference-vs-served comparison (concurrency 1).")
@click.option("--speed-iterations", type=click.IntRange(min=2), default=20, show_default=True,
              help="Timed calls per batch size and side (median and p99 over them).")
@click.option("--speed-warmup", type=click.IntRange(min=0), default=5, show_default=True,
              help="Warm-up calls per batch size and side.")
@click.option("--reference-device", type=click.Choice(["auto", "cpu", "cuda"]), default="auto", show_default=True,
              help="Device of the timed PyTorch reference (auto: CUDA when available). Accuracy is computed on the CPU.")
@click.option("--reference-threads", type=click.IntRange(min=1), default=None,
              help="torch.set_num_threads for the timed reference (default: torch's own; reported).")
@click.option("--time-budget", "time_budget", type=click.FloatRange(min=0, min_open=True), default=90.0, show_default=True,
              metavar="SECONDS",
              help="Wall-time budget of the run: the reference-speed phase (the last) gets what the earlier phases left "
                   "(20 s at least, or the whole budget if shorter) and marks what did not settle in it as not settled, "
                   "saying what was cut.")
@click.option("--thorough", is_flag=True, default=False,
              help="No time budget: every reference-speed timing runs until it settles or --max-trials (and is retried "
                   "once), however long that takes.")
@click.option("--progress/--no-progress", default=None, help="Progress bars (default: when stderr is a terminal).")
@click.option("--report", "report_dir", type=click.Path(file_okay=False), default=None,
              help="Write validate.json, validate.md, latency.png and samples.csv into DIR (default: print only).")
@click.option("--csv", "csv_path", type=click.Path(dir_okay=False), default=None,
              help="Write the latency table as CSV with perf_analyzer's -f columns, times in microseconds: one row per "
                   "concurrency; Client Send / Client Recv stay empty (not split client-side), Network+Server Send/Recv "
                   "is the client mean minus the server's request time.")
@json_option
@io_paths({"reference": "--reference", "weights": "--weights", "onnx": "--onnx", "data_spec": "--data", "preprocess": "--preprocess", "labels": "--labels"},
          {"report_dir": "--report", "csv_path": "--csv"})
def command(as_json: bool, csv_path: str | None, url: str, max_server_diff: float, protocol: str, model: str, model_version: str, reference: str, weights: str | None,
            output_names: str | None, input_shapes: tuple[str, ...], onnx: str | None, no_cache: bool,
            data_spec: str, preprocess: str | None, labels: str | None, limit: int | None, seed: int, batch_size: int,
            skip_non_images: bool,
            concurrency: tuple[int, ...], request_rate: str | None, request_distribution: str, measurement_interval: float,
            requests: int | None, stability_percentage: float, max_trials: int, percentiles: str,
            stability_percentile: int | None, warmup: int, shared_memory: str,
            max_top1_drop: float | None, min_cosine: float | None, min_embedding_cosine: float, min_map: float | None,
            max_map_drop: float | None, max_p99_ms: float | None, timeout: float,
            ready_timeout: float | None, label_output: str | None, worst: int, accuracy: bool, latency: bool, reference_speed: bool,
            speed_batch_sizes: tuple[int, ...], speed_iterations: int, speed_warmup: int, reference_device: str,
            reference_threads: int | None, time_budget: float, thorough: bool, progress: bool | None,
            report_dir: str | None) -> None:
    """Check a model served by Triton: its IO contract, its accuracy against the reference on
    the data, its latency/throughput per concurrency level, and its speed against the PyTorch
    reference per batch size (concurrency 1, the same batches on both sides).

    Exit code 0 when every threshold holds, 1 when the contract or a threshold fails (named in
    the message; the report is written), 2 for usage and connection errors.
    """
    from ..data import DataOptions  # noqa: PLC0415  # deferred: --help imports every command module; the stage loads only when the command runs
    from ..validate import REFUSED_GRACE_S, ReferenceSource, Thresholds, ValidateOptions, validate, write_latency_csv  # noqa: PLC0415  # deferred: --help imports every command module; the stage loads only when the command runs
    from ..validate.speed import SpeedOptions  # noqa: PLC0415  # deferred: --help imports every command module; the stage loads only when the command runs

    if csv_path is not None and not latency:
        raise UsageError("--csv writes the latency table: drop --no-latency")

    stability = Stability(interval_s=measurement_interval, requests=requests, pct=stability_percentage,
                          max_trials=max_trials, percentile=stability_percentile, percentiles=parse_percentiles(percentiles))
    speed = SpeedOptions(batch_sizes=speed_batch_sizes, iterations=speed_iterations, warmup=speed_warmup,
                         device=reference_device, threads=reference_threads, stability_pct=stability_percentage,
                         max_trials=max_trials) if reference_speed else None
    options = ValidateOptions(model=model, url=url, protocol=protocol, version=model_version,
                              concurrency=concurrency, requests=requests, stability=stability,
                              request_rates=parse_rates(request_rate) if request_rate else (),
                              distribution=request_distribution,
                              warmup=warmup, batch_size=batch_size, shared_memory=shared_memory, timeout=timeout,
                              ready_timeout=30.0 if ready_timeout is None else ready_timeout,
                              refused_grace=REFUSED_GRACE_S if ready_timeout is None else None, worst=worst, label_output=label_output, accuracy=accuracy, latency=latency, progress=progress,
                              speed=speed, max_server_diff=max_server_diff,
                              time_budget=None if thorough else time_budget)
    thresholds = Thresholds(max_top1_drop=max_top1_drop, max_p99_ms=max_p99_ms, min_cosine=min_cosine,
                            min_embedding_cosine=None if min_embedding_cosine <= -1 else min_embedding_cosine,
                            min_map=min_map, max_map_drop=max_map_drop)
    with summary_output(as_json) as emit:
        data = DataOptions(spec=data_spec, preprocess=preprocess, labels=labels, limit=limit, seed=seed,
                           skip_non_images=skip_non_images)
        source = ReferenceSource(reference, weights=weights, onnx=onnx, input_shapes=input_shapes, cache=not no_cache,
                                 output_names=tuple(n.strip() for n in output_names.split(",")) if output_names else ())
        report = validate(options, reference=source, data=data, report_dir=report_dir, thresholds=thresholds)
        for line in report.summary_lines():
            click.echo(line)
        if csv_path is not None:
            if not report.latency:
                raise UsageError("--csv writes the latency table: drop --no-latency")
            click.echo(f"wrote {write_latency_csv(report.latency, csv_path)}")
        if report_dir is not None:
            click.echo(f"report: {report.files.get('markdown')}")
        emit({"command": "validate", **report.to_dict()})
        if not report.passed:
            detail = report.failure_detail()
            where = f" (report {report.files.get('markdown')})" if report_dir is not None else ""
            raise TrtrepoError(f"validation failed: {detail}{where}")
