"""The flow of ``trtrepo serve``: imported only when the command runs (it loads the server
stage and the object store; ``--help`` imports every command module)."""

from __future__ import annotations

import math
import signal
import time
from dataclasses import dataclass
from pathlib import Path

import click

from ..contracts.location import is_remote
from ..errors import UsageError
from ..fsutil import temp_dir
from ..objectstore import list_remote, parse_url, snapshot
from ..repository import list_repository, load_problems
from ..server import (
    ServerError,
    TritonServer,
    check_distinct_ports,
    container_command,
    find_server_binary,
    log_errors,
    runnable_server_binary,
)


@dataclass(frozen=True)
class ServeArgs:
    """The command's arguments as given (ports: HTTP, gRPC, metrics; 0 is a free port)."""

    repo: str
    s3_endpoint: str | None
    server_binary: str | None
    host: str
    ports: tuple[int, int, int]
    timeout: float
    in_place: bool
    print_command: bool
    server_args: tuple[str, ...]


def serve(args: ServeArgs) -> None:
    """Check the options and the repository, then either print the container command (asked
    for, or no tritonserver here) or run tritonserver in the foreground."""
    _check_options(args.timeout, args.host)
    remote = is_remote(args.repo)
    repo, names, problems = _repository(args.repo, args.s3_endpoint, args.in_place)
    for where, why in problems:
        click.echo(f"warning: {where}: {why}; 'trtrepo repo check --fix {repo}' repairs what an interrupted trtrepo "
                   f"write left", err=True)
    # a file that cannot run is named (with where it came from) unless only the command is printed
    binary = find_server_binary(args.server_binary) if args.print_command else runnable_server_binary(args.server_binary)
    if args.print_command or binary is None:
        _print_container_command(repo, remote, binary, args)
        return
    _run_foreground(repo, names if remote else None, binary, args)


def _check_options(timeout: float, host: str) -> None:
    """A finite positive readiness timeout and a non-empty host."""
    if not (timeout > 0 and math.isfinite(timeout)):
        raise UsageError(f"--timeout {timeout}: a positive number of seconds")
    if not host.strip():
        raise UsageError("--host: empty (give an address to listen on, e.g. 127.0.0.1)")


def _repository(repo: str, s3_endpoint: str | None, in_place: bool) -> tuple[str, list[str], list[tuple[str, str]]]:
    """The repository as served (an object-store URL normalised), its model names when remote,
    and the folders tritonserver would refuse to start on (said before it starts). Decision: a
    remote repository is listed here (failing on credentials, endpoint or bucket) since
    tritonserver reads it itself; a local one must exist, and its hidden folders count only in
    place (the copy a server gets by default leaves them out)."""
    if is_remote(repo):
        repo = parse_url(repo, s3_endpoint).url
        entries = list_remote(repo)
        problems = [(f"{repo}/{e.name}/", e.problem) for e in entries
                    if e.problem and e.problem.startswith("no config.pbtxt")]
        return repo, [e.name for e in entries], problems
    if not Path(repo).is_dir():
        raise UsageError(f"{repo}: model repository not found (create one with 'trtrepo deploy')")
    return repo, [], [(str(p), why) for p, why in load_problems(repo) if in_place or not p.name.startswith(".")]


def _print_container_command(repo: str, remote: bool, binary: Path | str | None, args: ServeArgs) -> None:
    """The Triton container command for the repository (the release whose TensorRT matches its
    plans); decision: a remote repository is passed as its URL with the AWS credentials of the
    environment instead of a mounted folder."""
    if binary is None and args.server_binary:
        raise UsageError(f"--server-binary {args.server_binary}: not a file")
    http_port, grpc_port, metrics_port = args.ports
    check_distinct_ports({"--http-port": http_port or 8000, "--grpc-port": grpc_port or 8001,
                          "--metrics-port": metrics_port or 8002})
    with temp_dir("serve") as tmp:
        local = snapshot(repo, Path(tmp) / "repo") if remote else Path(repo)
        cmd, _rel, notes = container_command(local, http_port=http_port or 8000, grpc_port=grpc_port or 8001,
                                             metrics_port=metrics_port or 8002)
        if remote:
            cmd = cmd.replace(f"-v {local.resolve()}:/models ", "-e AWS_ACCESS_KEY_ID -e AWS_SECRET_ACCESS_KEY "
                              "-e AWS_DEFAULT_REGION ").replace("--model-repository=/models", f"--model-repository={repo}")
    if binary is None:
        click.echo("tritonserver not found here (install it with scripts/install_tritonserver.sh, or give "
                   "--server-binary); run the Triton container instead:", err=True)
    for n in notes:
        click.echo(f"# {n}")
    click.echo(cmd)


def _run_foreground(repo: str, remote_names: list[str] | None, binary: Path | str, args: ServeArgs) -> None:
    """Start tritonserver, say it is ready, and wait until it exits (an error with its log's
    errors) or is stopped (SIGINT/SIGTERM). ``remote_names``: the models of a remote repository
    (None: listed from the local one)."""
    http_port, grpc_port, metrics_port = args.ports
    server = TritonServer(repo, binary=binary, host=args.host, http_port=http_port or None, grpc_port=grpc_port or None,
                          metrics_port=metrics_port or None, timeout=args.timeout, copy=not args.in_place,
                          extra_args=args.server_args, keep_log=True)
    server.start()
    for lo in server.reaped:
        click.echo(f"note: removed {lo.describe()}", err=True)
    try:
        # Before the lines that say it is ready: a signal sent on reading them must find the handlers.
        signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
        # Ctrl-C / kill -INT stop it even when started with SIGINT ignored (a background job of a
        # non-interactive shell): Python then installs no handler itself.
        signal.signal(signal.SIGINT, signal.default_int_handler)
        models = ", ".join(remote_names if remote_names is not None else [e.name for e in list_repository(repo)])
        click.echo(f"tritonserver ready: HTTP {server.http_url}  gRPC {server.grpc_url}  metrics {args.host}:{server.metrics_port}")
        click.echo(f"models: {models}")
        click.echo(f"log: {server.log_path}  (Ctrl-C to stop)")
        while server.proc is not None and server.proc.poll() is None:
            time.sleep(0.5)
        code = server.proc.returncode if server.proc is not None else 0
        errors = log_errors(server.log_text()) or server.log_tail().splitlines()
        raise ServerError(f"tritonserver exited with code {code}; log kept at {server.log_path}:\n" + "\n".join(errors))
    except KeyboardInterrupt:
        click.echo("stopping tritonserver")
    finally:
        server.stop()
