"""Option values parsed at the edge (issue 42): click ParamTypes that turn the text of
``--accuracy-target``, ``--smooth-quant``, ``--shape``, ``--concurrency``, ``--speed-batch-sizes``
and ``--ranges`` into the typed values the library takes. Each calls the library's own parser
(one owner of the syntax); a bad value is click's one-line "Invalid value for '--flag'", exit 2.

The parsers are imported when a value is converted, not when the command module is: ``--help``
imports every command module."""

from __future__ import annotations

import importlib
from typing import Any

import click

from ..errors import OptionError, UsageError


class Parsed(click.ParamType):
    """A value parsed by ``module:function`` of the library (``trtrepo.evaluate:parse_target``);
    values that are no longer text (defaults given typed) pass through."""

    def __init__(self, name: str, parser: str, metavar: str) -> None:
        self.name, self._parser, self._metavar = name, parser, metavar

    def get_metavar(self, param: click.Parameter, ctx: click.Context | None = None) -> str:
        return self._metavar

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if not isinstance(value, str):
            return value
        module, _, function = self._parser.partition(":")
        parse = importlib.import_module(module)
        for part in function.split("."):
            parse = getattr(parse, part)
        try:
            return parse(value)  # type: ignore[operator]
        except OptionError as exc:
            self.fail(exc.detail.lstrip(": "), param, ctx)
        except UsageError as exc:
            self.fail(exc.message, param, ctx)


ACCURACY_TARGET = Parsed("accuracy target", "trtrepo.evaluate:AccuracyTarget.parse", "KIND=VALUE")
SMOOTH_QUANT = Parsed("SmoothQuant alpha", "trtrepo.smoothquant:parse_alpha", "off|auto|ALPHA")
SHAPE = Parsed("shape range", "trtrepo.contracts.profile:parse_shape_option", "NAME:MIN,OPT,MAX")
CONCURRENCY = Parsed("concurrency levels", "trtrepo.validate.options:parse_concurrency", "N,N,...")
SPEED_BATCH_SIZES = Parsed("batch sizes", "trtrepo.validate.speed:parse_batch_sizes", "N,N,...")
RANGES = Parsed("ranges file", "trtrepo.qdq:RangesFile.read", "FILE")
