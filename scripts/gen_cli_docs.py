"""Write docs/cli.md: the ``--help`` text of ``trtrepo`` and of every command and subcommand.

    python scripts/gen_cli_docs.py            # rewrite docs/cli.md
    python scripts/gen_cli_docs.py --check    # exit 1 when docs/cli.md differs from the CLI

The text is click's own help, rendered at a fixed width (100 columns) so that the file does not
depend on the terminal it was generated from; tests/test_cli_docs.py fails when the file is stale.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import click

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs" / "cli.md"
WIDTH = 100

HEADER = """\
# Command-line reference

Generated from the click commands by `python scripts/gen_cli_docs.py`; do not edit by hand.
`tests/test_cli_docs.py` fails when this file differs from the CLI's `--help`. The same text is
printed by `trtrepo --help` and `trtrepo COMMAND [SUBCOMMAND] --help` (here at {width} columns).
Prose about the commands: [README](../README.md), [quantization](quantization.md),
[serving](serving.md), [fleet](fleet.md).

`trtrepo --help` lists every command; `trtrepo COMMAND --help` its options. Errors are one line
naming the file, tensor or option at fault; exit code 2 for usage errors, 1 for failures;
`trtrepo --debug ...` shows the traceback.
"""

# Written by hand (edit it here): what holds for every command.
CONVENTIONS = """\
## In pipelines: `-v`/`-q`, `--json`, `--csv`, exit codes

- Every command takes `-v`/`-q` before or after its name (`trtrepo -q deploy ...` or
  `trtrepo deploy ... -q`). Status lines (`[2/4] int8 done in 6.4s: ...` per deploy step) and
  progress bars go to stderr on a terminal; `-v` shows them (and INFO logs) in pipes and CI logs
  too, `-q` leaves only results and errors. `-v` and `-q` together are a usage error.
- `--json` on `calibrate`, `quantize`, `evaluate`, `deploy` and `validate` prints one JSON object on
  stdout (the human lines go to stderr): `calibrate` {samples, written, amax per tensor},
  `quantize` {output, target, method, layers, activations, weights, accuracy_check, methods,
  warnings}, `evaluate` {outputs (per-output metrics), thresholds, passed}, `deploy` {precision,
  steps, models, notes, warnings}, `validate` {the whole report: contract, accuracy with per_sample
  rows, latency, thresholds, passed}. Each of `warnings` is an object with `cause` and `message`
  (the line printed); a warning that would repeat per layer (`int32_bias`, `unit_without_range`)
  is one object per cause with `counts`, `shipped` and `details` (one per layer or tensor). Example: `trtrepo deploy m.onnx --data imgs/ --preprocess pre.json --json | jq .precision`.
- `validate --csv lat.csv` writes the latency table with perf_analyzer's `-f` columns (times in
  microseconds, one row per concurrency; `Client Send`/`Client Recv` empty, `Network+Server Send/Recv`
  = client mean minus the server's request time). `--report DIR` is optional.
- `evaluate --max-top1-drop POINTS --min-cosine C` gate like `validate`'s thresholds.
- Exit codes everywhere: 0 success, 1 a failure (a threshold, the contract, a server that answered
  with an error), 2 bad input or options, or a server that cannot be reached or went away. Errors
  are one line starting with `error:`; `--debug` adds the traceback and keeps the exit code. A closed
  stdout (`trtrepo calibrate ... | head -1`) ends the run quietly with exit 0. SIGTERM unwinds like
  Ctrl-C (temporary folders and the server child are cleaned up; exit 143).

## Dynamic ranges without calibration: `--ranges FILE`

`quantize` and `deploy` take the ranges of any model's tensors from a JSON file instead of
calibrating (the TensorRT user who sets dynamic ranges by hand): per tensor an `amax` (the range
`[-amax, amax]`; TensorRT's dynamic range), and for the onnxruntime target optionally the signed
`min`/`max` it quantizes over. Tensors the placement quantizes and the file does not name are an
error naming the first one. `--data` then only serves the check against FP32 (without it the
report says accuracy was NOT measured). The names are the ONNX tensor names (a graph input or a
node's output); `trtrepo calibrate MODEL --data SPEC --ranges r.json` writes such a file for every
tensor to start from (its other keys, `scale` and `rangemath`, are not read here).

```bash
cat > ranges.json <<'JSON'
{"tensors": {"images": {"amax": 1.0, "min": 0.0, "max": 1.0},
             "/model.0/conv/Conv_output_0": {"amax": 11.5}}}
JSON
trtrepo quantize yolo.onnx -o yolo.int8.onnx --ranges ranges.json --target tensorrt --data held_out.npy
trtrepo deploy yolo.onnx --repo models --ranges ranges.json --data held_out.npy   # the same, into a repository
```
"""


def _walk(command: click.Command, ctx: click.Context):
    """(path, help text) for ``command`` and everything under it, in the CLI's own order."""
    yield ctx.command_path, command.get_help(ctx).rstrip() + "\n"
    if isinstance(command, click.Group):
        for name in command.list_commands(ctx):
            sub = command.get_command(ctx, name)
            if sub is None or getattr(sub, "hidden", False):
                continue
            yield from _walk(sub, click.Context(sub, info_name=name, parent=ctx, **sub.context_settings))


def render() -> str:
    """docs/cli.md's text for the CLI as it is now."""
    sys.path.insert(0, str(ROOT))
    from trtrepo.cli import cli

    # the contexts click builds for `--help` (context_settings included: -h, --help)
    root = click.Context(cli, info_name="trtrepo", terminal_width=WIDTH, max_content_width=WIDTH,
                         **cli.context_settings)
    pages = list(_walk(cli, root))
    lines = [HEADER.format(width=WIDTH), CONVENTIONS, "## Commands\n"]
    for path, _ in pages:
        anchor = path.replace(" ", "-")
        lines.append(f"- [`{path}`](#{anchor})")
    lines.append("")
    for path, text in pages:
        lines += [f"## {path}\n", "```text", text.rstrip("\n"), "```", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="exit 1 when docs/cli.md is stale; write nothing")
    ap.add_argument("-o", "--output", type=Path, default=DOCS, help="where to write (default docs/cli.md)")
    args = ap.parse_args(argv)
    text = render()
    if args.check:
        current = args.output.read_text() if args.output.exists() else ""
        if current != text:
            print(f"{args.output} is stale: run python scripts/gen_cli_docs.py", file=sys.stderr)
            return 1
        return 0
    args.output.write_text(text)
    print(f"wrote {args.output} ({text.count(chr(10))} lines)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
