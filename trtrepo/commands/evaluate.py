"""``trtrepo evaluate``."""

from __future__ import annotations

from pathlib import Path

import click

from ..errors import TrtrepoError, UsageError
from ..modelio import ModelIO, load_onnx
from ._inputs import io_paths
from ._options import data_options
from ._output import json_option, summary_output


@click.command("evaluate")
@click.argument("reference", type=click.Path(dir_okay=False))
@click.argument("candidate", type=click.Path(dir_okay=False))
@data_options(required=True)
@click.option("--threads", type=click.IntRange(min=1), default=None, help="ONNX Runtime intra-op threads.")
@click.option("--report", "report_dir", type=click.Path(file_okay=False), default=None,
              help="Write evaluation.json and evaluation.md into DIR.")
@click.option("--label-output", default=None, metavar="NAME",
              help="The classification output: top-1/top-5 and accuracy are reported for it (default: the first [N, C] output).")
@json_option
@click.option("--max-top1-drop", type=float, default=None, metavar="POINTS",
              help="Fail (exit 1) when the label output's top-1 accuracy drop (vs labels, else the expected top-1 "
                   "drop under REFERENCE's softmax, with 95 % confidence) exceeds this, like 'trtrepo validate'.")
@click.option("--min-cosine", type=float, default=None,
              help="Fail (exit 1) when an output's mean cosine similarity is lower.")
@io_paths({"reference": "REFERENCE", "candidate": "CANDIDATE", "data_spec": "--data", "preprocess": "--preprocess", "labels": "--labels"},
          {"report_dir": "--report"})
def command(as_json: bool, max_top1_drop: float | None, min_cosine: float | None, reference: str, candidate: str, data_spec: str, preprocess: str | None, labels: str | None,
            limit: int | None, seed: int, batch_size: int, skip_non_images: bool, threads: int | None, report_dir: str | None,
            label_output: str | None) -> None:
    """Run REFERENCE (FP32 ONNX) and CANDIDATE (e.g. the Q/DQ model) with ONNX Runtime on the same
    data; print per output max/mean absolute error and cosine similarity, and top-1/top-5
    agreement and accuracy against labels for the classification (label) output.
    """
    from ..data import open_data  # noqa: PLC0415  # deferred: --help imports every command module; the stage loads only when the command runs
    from ..evaluate import evaluate  # noqa: PLC0415  # deferred: --help imports every command module; the stage loads only when the command runs

    for p in (reference, candidate):
        if not Path(p).is_file():
            raise UsageError(f"{p}: model file not found")
    io_ref = ModelIO.from_onnx(load_onnx(reference, load_weights=False), source=reference)
    io_cand = ModelIO.from_onnx(load_onnx(candidate, load_weights=False))
    if io_ref.input_names != io_cand.input_names or io_ref.output_names != io_cand.output_names:
        raise UsageError(f"{candidate}: inputs/outputs {io_cand.input_names}/{io_cand.output_names} differ from "
                         f"{reference}'s {io_ref.input_names}/{io_ref.output_names}")
    source = open_data(data_spec, io=io_ref, preprocess=preprocess, labels=labels, limit=limit, seed=seed,
                       skip_non_images=skip_non_images)
    from ..validate import Thresholds, check_thresholds, detector_output_classes  # noqa: PLC0415  # deferred: --help imports every command module; the stage loads only when the command runs

    # bad limits fail before any work; no default gate: evaluate reports, its thresholds are opt-in
    thresholds = Thresholds(max_top1_drop=max_top1_drop, min_cosine=min_cosine, min_embedding_cosine=None)
    with summary_output(as_json) as emit:
        report = evaluate(reference, candidate, source, batch_size=batch_size, threads=threads, label_output=label_output,
                          detectors=detector_output_classes(io_ref))
        click.echo(report.to_markdown().rstrip())
        if report_dir is not None:
            j, m = report.write(report_dir)
            click.echo(f"wrote {j} and {m}")
        summary = report.to_dict()
        outputs = summary["outputs"]
        for name, o in outputs.items():  # validate's key: the drop vs labels, else the expected drop, in points
            if o.get("top1_agreement") is not None and "top1_drop_points" not in o:
                o["top1_drop_points"] = report.outputs[name].top1_drop_points
        label = summary.get("label_output") or next((n for n, o in outputs.items() if o.get("top1_agreement") is not None),
                                                    None)
        results = check_thresholds({"accuracy": {"outputs": outputs, "label_output": label}},
                                   thresholds)
        for t in results:
            click.echo(f"  {t.name}: {t.value:.4g} (limit {t.limit:g}) {'ok' if t.passed else 'FAILED'}")
        failed = [t for t in results if not t.passed]
        emit({"command": "evaluate", **summary, "thresholds": [t.to_dict() for t in results], "passed": not failed})
    if failed:
        raise TrtrepoError("evaluation failed: " + "; ".join(f"{t.name} = {t.value:.4g}, limit {t.limit:g} ({t.detail})"
                                                            for t in failed))
