"""The ``trtrepo`` command line: a thin click group over the pipeline stages.

Commands live in :mod:`trtrepo.commands` and are imported only when run (or when ``--help``
lists them), so heavy dependencies never load for ``trtrepo --help``. Every command raises
:class:`~trtrepo.errors.TrtrepoError` for user-facing failures; the group prints its one-line
message and exits with its code (1 failure, 2 usage), with a traceback only under ``--debug``.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import importlib
import logging
import os
import signal
import sys
import traceback
from typing import Any

import click

from . import __version__
from .errors import OptionError, TrtrepoError, UsageError, one_line, printable
from .progress import configure

# name -> (module under trtrepo.commands, short help). Order is the pipeline's.
COMMANDS: dict[str, tuple[str, str]] = {
    "export": ("export", "Export a model source (demo, ONNX, TorchScript, entry point, torchvision) to ONNX."),
    "calibrate": ("calibrate", "Collect activation histograms and compute INT8 ranges and a TensorRT calibration cache."),
    "quantize": ("quantize", "Insert Q/DQ nodes (explicit INT8) for TensorRT or ONNX Runtime."),
    "evaluate": ("evaluate", "Compare an FP32 and a quantized ONNX model on data with ONNX Runtime."),
    "build": ("build", "Build a TensorRT model.plan from a Q/DQ ONNX model (needs TensorRT and a GPU)."),
    "deploy": ("deploy", "Export, calibrate, quantize, build and write a Triton model repository in one go."),
    "repo": ("repo", "Inspect and write Triton model repositories."),
    "serve": ("serve", "Start tritonserver on a model repository (or print the container command)."),
    "manifests": ("manifests", "Write Kubernetes manifests (Deployment, Service, HPA, KServe) for a repository in object storage."),
    "validate": ("validate", "Check a running Triton server: contract, accuracy against PyTorch, latency."),
    "tune": ("tune", "Search a model's serving config (instances, threads, batching) on the real server."),
    "preprocess": ("preprocess", "Write a preprocessing spec file shared by calibration, evaluation and the harness."),
    "doctor": ("doctor", "Report which stages can run on this machine."),
}


class LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name not in COMMANDS:
            return None
        module_name, short = COMMANDS[name]
        try:
            module = importlib.import_module(f"trtrepo.commands.{module_name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"trtrepo.commands.{module_name}":
                raise
            return _not_available(name, short)
        cmd: click.Command = module.command
        return _with_verbosity(cmd)

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except TrtrepoError as exc:
            if ctx.params.get("debug"):  # the traceback, and still the documented exit code
                traceback.print_exc()
            message = exc.with_flags(_flags(self, ctx)) if isinstance(exc, OptionError) else exc.message
            click.echo(f"error: {message if exc.multiline else printable(message)}", err=True)
            ctx.exit(exc.exit_code)
        except click.UsageError as exc:  # option parsing: one line too, naming the option
            sub = exc.ctx.command_path if exc.ctx is not None else "trtrepo"
            click.echo(f"error: {printable(exc.format_message())} (see '{sub} --help')", err=True)
            ctx.exit(exc.exit_code)
        except BrokenPipeError:
            _closed_pipe()
        except (click.ClickException, click.exceptions.Exit, click.Abort, KeyboardInterrupt):
            raise
        except Exception as exc:
            if ctx.params.get("debug"):
                traceback.print_exc()
                ctx.exit(1)
            if isinstance(exc, OSError) and exc.filename is not None:  # a file or folder at fault: name it, one line
                path = f"{exc.filename} -> {exc.filename2}" if exc.filename2 is not None else str(exc.filename)
                click.echo(f"error: {printable(path)}: {exc.strerror or one_line(exc)}", err=True)
                ctx.exit(2 if exc.errno in _PATH_ERRNOS else 1)
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            click.echo(f"error: {type(exc).__name__}: {first} (run with --debug for the traceback)", err=True)
            ctx.exit(1)


def _flags(group: click.Group, ctx: click.Context) -> dict[str, str]:
    """The running command's flags by parameter name (``accuracy_target`` -> ``--accuracy-target``;
    an argument by its metavar): how an :class:`~trtrepo.errors.OptionError` is named here. For a
    command group (``repo``) the flags of its subcommands together (``repo add``'s among them)."""
    name = ctx.invoked_subcommand
    flags: dict[str, str] = {}
    todo = [group.get_command(ctx, name)] if name else []
    while todo:
        cmd = todo.pop()
        if isinstance(cmd, click.Group):
            todo.extend(cmd.get_command(ctx, n) for n in cmd.list_commands(ctx))
            continue
        for p in cmd.params if cmd is not None else ():
            if p.name is None or p.name in flags:
                continue
            if isinstance(p, click.Argument):
                flags[p.name] = p.human_readable_name
            else:
                long = [o for o in p.opts if o.startswith("--")]
                flags[p.name] = max(long, key=len) if long else p.opts[0]
    return flags


# An OSError no stage turned into a message: these say the path given is at fault (exit 2, as a
# UsageError); the others (a full disk, an I/O error) are failures (exit 1).
_PATH_ERRNOS = {errno.ENOENT, errno.ENOTDIR, errno.EISDIR, errno.EEXIST, errno.EACCES, errno.EPERM,
                errno.ENAMETOOLONG, errno.ELOOP, errno.EROFS, errno.ENXIO}


def _with_verbosity(cmd: click.Command) -> click.Command:
    """``-v/--verbose`` and ``-q/--quiet`` after the subcommand too (``trtrepo deploy -q ...``), on
    every command and subcommand; they add to the group's."""
    if isinstance(cmd, click.Group):
        for sub in cmd.commands.values():
            _with_verbosity(sub)
        return cmd
    if getattr(cmd, "_trtrepo_verbosity", False) or cmd.callback is None:
        return cmd
    cmd.params += [click.Option(["-v", "--verbose", "_verbose"], count=True, help="More output (-vv: debug logs)."),
                   click.Option(["-q", "--quiet", "_quiet"], is_flag=True, help="Only results and errors.")]
    original = cmd.callback

    @functools.wraps(original)
    def callback(*args: Any, _verbose: int = 0, _quiet: bool = False, **kwargs: Any) -> Any:
        ctx = click.get_current_context()
        root = ctx.find_root().params
        _configure(root.get("verbose", 0) + _verbose, bool(root.get("quiet")) or _quiet)
        _refuse_empty_paths(ctx)
        return original(*args, **kwargs)

    cmd.callback = callback
    cmd._trtrepo_verbosity = True  # type: ignore[attr-defined]
    return cmd


def _refuse_empty_paths(ctx: click.Context) -> None:
    """An empty path (``--repo ""``, ``-o "$UNSET"``) is a usage error naming its option: read as
    the current folder it wrote a repository or a report into wherever the command ran."""
    for param in ctx.command.params:
        value = ctx.params.get(param.name or "")
        values = value if isinstance(value, (tuple, list)) else (value,)
        if isinstance(param.type, click.Path) and "" in values:
            label = max(param.opts, key=len) if isinstance(param, click.Option) else param.human_readable_name
            raise UsageError(f"{label} '': an empty path (give a file or folder name)")


def _configure(verbose: int, quiet: bool) -> None:
    if verbose and quiet:
        raise UsageError("-v and -q exclude each other")
    level = logging.ERROR if quiet else logging.WARNING - 10 * min(verbose, 2)
    logging.getLogger("trtrepo").setLevel(level)
    configure(verbose, quiet)


def _not_available(name: str, short: str) -> click.Command:
    @click.command(name=name, help=f"{short}\n\nNot available in this version of trtrepo yet.", add_help_option=True,
                   context_settings={"ignore_unknown_options": True, "allow_extra_args": True})
    def _cmd() -> None:
        raise TrtrepoError(f"'trtrepo {name}' is not available in this version yet")

    _cmd.short_help = f"{short} [not yet available]"
    return _cmd


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="trtrepo")
@click.option("--debug", is_flag=True, help="Show tracebacks for errors.")
@click.option("-v", "--verbose", count=True, help="More output: status lines also off a terminal, INFO logs (-vv: debug).")
@click.option("-q", "--quiet", is_flag=True, help="Only results and errors: no status lines, bars or warnings.")
@click.pass_context
def cli(ctx: click.Context, debug: bool, verbose: int, quiet: bool) -> None:
    """trtrepo: from a trained model and a little data to a validated Triton model repository
    with INT8 TensorRT engines.

    Pipeline: export -> calibrate -> quantize -> build -> repo/deploy -> serve -> validate.
    """
    level = logging.ERROR if quiet else logging.WARNING - 10 * min(verbose, 2)
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    logging.getLogger("trtrepo").setLevel(level)
    ctx.ensure_object(dict)
    ctx.obj["debug"] = debug


class _Terminated(SystemExit):
    """Raised by the SIGTERM handler; ``main`` ends the process once it has unwound."""


TERMINATE_RETRY_S = 0.05  # a SIGTERM that arrived during an import is delivered again this much later


def _importing(frame: Any) -> bool:
    """Whether a frame of Python's import machinery is on the stack that ``frame`` ends."""
    while frame is not None:
        if frame.f_code.co_filename.startswith("<frozen importlib"):
            return True
        frame = frame.f_back
    return False


def _terminated(signum: int, frame: Any) -> None:
    """SIGTERM (a CI timeout, ``kill``, a container stop): unwind like Ctrl-C so temporary folders,
    shared-memory regions and the server child are cleaned up by their ``finally`` blocks.

    Decision: not in the middle of an import (trtrepo imports torch, ONNX Runtime and its own
    stages lazily, so a signal often lands in one). Raised there, the exception was swallowed by
    the import lock's weakref callback ("Exception ignored in ... cb": the run went on and exited 0)
    or aborted torch's initialisation (SIGABRT, exit -6); both seen in tests/test_cleanup.py. The
    signal is sent again :data:`TERMINATE_RETRY_S` later (SIGALRM) until no import runs."""
    if hasattr(signal, "SIGALRM") and _importing(frame):  # no SIGALRM on Windows: raise at once there
        signal.setitimer(signal.ITIMER_REAL, TERMINATE_RETRY_S)
        return
    raise _Terminated(128 + signum)


def _terminate_again(_signum: int, _frame: Any) -> None:
    os.kill(os.getpid(), signal.SIGTERM)


def main() -> None:  # console script entry point

    if hasattr(signal, "SIGALRM"):
        signal.signal(signal.SIGALRM, _terminate_again)
    signal.signal(signal.SIGTERM, _terminated)
    try:
        cli(prog_name="trtrepo")
    except _Terminated as exc:
        # cleaned up; skip the interpreter's finalization, where the thread pools of ONNX Runtime
        # or torch, stopped mid-work, can abort the process (SIGABRT) and hide the exit code
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(int(exc.code or 1))


def _closed_pipe() -> None:
    """The reader of our stdout went away (``trtrepo ... | head -1``): what it wanted it has; exit 0
    quietly, with stdout pointed at /dev/null so the interpreter's final flush cannot fail."""

    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    raise SystemExit(0)


if __name__ == "__main__":
    main()
