"""The INT8 request, declared once: :class:`QuantizeSettings`.

``trtrepo quantize`` and ``trtrepo deploy`` take the same INT8 options through one option group
(``trtrepo.commands._options.quantize_options``), which builds this record from the parsed values
by field name; ``deploy`` passes it on untouched (``DeployOptions.int8``) and the quantize stage
reads it (``QuantizeRequest.int8``). A new INT8 knob is a field here (or, for where Q/DQ go, on
:class:`~trtrepo.qdq.QuantizeOptions`) and an option in that group: two files, then the
code that acts on it (tests/test_settings.py proves it).

What stays outside: the data (:class:`~trtrepo.data.DataOptions`, shared with every command)
and how one run is carried out (batch size, threads, report folder, progress, time budgets).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ..data import DataSource
from ..errors import OptionError
from ..evaluate import AccuracyTarget
from ..qdq import DETECTOR_TASKS, QuantizeOptions, RangesFile
from ..smoothquant import parse_alpha
from .ranges import DEFAULT_HOLDOUT


@dataclass(frozen=True)
class QuantizeSettings:
    """What INT8 model to make and when to accept it.

    * ``placement``: where Q/DQ go (the :class:`~trtrepo.qdq.QdqTarget` record, exclusions,
      attention MatMuls, 7-bit weights); ``target_from_backend``: ``deploy`` places for the
      backend's runtime (``--target auto``; ``quantize`` keeps ``placement.target``);
    * ``method``: a registered calibration method or ``auto`` (None: auto when calibrating here);
      ``smooth_quant``: an alpha, ``auto`` or None; ``weight_rounding``: ``auto`` or a step;
      ``equalize``: activation equalization before calibration;
    * ``ranges`` (:class:`~trtrepo.qdq.RangesFile`) or ``cache`` (a TensorRT calibration
      cache): ranges computed earlier, no calibration;
    * ``accuracy_target``: leave the most sensitive layers in float until it holds;
      ``accept_accuracy_loss``: write the model although the held-out check fails;
    * ``eval_data`` (a spec or an open source; default: a ``holdout`` fraction of the data) and
      ``metric_output`` (the output the choices and the check are measured on);
    * ``task``: ``auto`` (a detector is found from the graph's decode head or the exporter's
      metadata) or ``detect`` (the user says it is one: its YOLO-layout outputs are judged in boxes,
      refused when it has none; :func:`~trtrepo.qdq.detector_outputs`). Only these two: what
      else a model is (classifier or embedding) is read off its outputs and chosen per output by
      ``metric_output`` and ``accuracy_target``, and a detector is the one kind whose judging (decode
      + NMS in boxes) cannot be read off the output's values."""

    placement: QuantizeOptions = field(default_factory=QuantizeOptions)
    target_from_backend: bool = False
    method: str | None = None
    smooth_quant: float | str | None = "auto"
    weight_rounding: str = "auto"
    equalize: bool = True
    ranges: RangesFile | None = None
    cache: str | Path | None = None
    accuracy_target: AccuracyTarget | None = None
    accept_accuracy_loss: bool = False
    eval_data: DataSource | str | None = None
    holdout: float = DEFAULT_HOLDOUT
    metric_output: str | None = None
    task: str = "auto"

    def __post_init__(self) -> None:
        # from scripts: text as on the command line, parsed by the same parsers as the CLI's
        if isinstance(self.ranges, (str, Path)):
            object.__setattr__(self, "ranges", RangesFile.read(self.ranges))
        if isinstance(self.accuracy_target, str):
            object.__setattr__(self, "accuracy_target", AccuracyTarget.parse(self.accuracy_target))
        object.__setattr__(self, "smooth_quant", parse_alpha(self.smooth_quant))
        if self.ranges is not None and self.cache is not None:
            raise OptionError("ranges", "and {cache} exclude each other: give one", concept="the ranges file",
                              others={"cache": "the calibration cache"})
        if self.task not in DETECTOR_TASKS:
            raise OptionError("task", f"{self.task!r}: expected one of {', '.join(DETECTOR_TASKS)}", concept="the task")
        if not 0.0 < self.holdout < 1.0:
            raise OptionError("holdout", f"{self.holdout}: expected a fraction between 0 and 1",
                              concept="the held-out fraction")

    @property
    def given(self) -> str | None:
        """The file the ranges were given in (None: calibrate here)."""
        if self.ranges is not None:
            return str(self.ranges.path)
        return None if self.cache is None else str(self.cache)
