"""``trtrepo serve``."""

from __future__ import annotations

import math
import signal
import time
from pathlib import Path

import click

from ..contracts.location import is_remote
from ..errors import UsageError
from ..fsutil import temp_dir
from ._options import s3_endpoint_option


@click.command("serve")
@click.argument("repo", type=click.Path(file_okay=False), default="model_repository")
@s3_endpoint_option
@click.option("--server-binary", type=click.Path(dir_okay=False), default=None,
              help="tritonserver to run (default: $TRTREPO_TRITONSERVER, PATH, then .triton/bin/tritonserver).")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on (loopback by default).")
@click.option("--http-port", type=click.IntRange(0, 65535), default=8000, show_default=True, help="0: a free port.")
@click.option("--grpc-port", type=click.IntRange(0, 65535), default=8001, show_default=True, help="0: a free port.")
@click.option("--metrics-port", type=click.IntRange(0, 65535), default=8002, show_default=True, help="0: a free port.")
@click.option("--timeout", type=float, default=120.0, show_default=True, help="Seconds to wait for readiness.")
@click.option("--in-place", is_flag=True, help="Serve REPO itself instead of a temporary copy (the Python backend writes __pycache__).")
@click.option("--print-command", is_flag=True, help="Only print the container command for REPO.")
@click.argument("server_args", nargs=-1, type=click.UNPROCESSED)
def command(repo: str, s3_endpoint: str | None, server_binary: str | None, host: str, http_port: int, grpc_port: int, metrics_port: int,
            timeout: float, in_place: bool, print_command: bool, server_args: tuple[str, ...]) -> None:
    """Start tritonserver on REPO, wait until it is ready and stay in the foreground (Ctrl-C stops it).

    Ports another process listens on are refused (exit 2); "ready" is printed only when this
    server answers. A failed start prints the model load errors from Triton's log, which is kept.
    Python-backend models run in $TRTREPO_PYTHON_ENV or .triton/pyenv (first on the server's PATH)
    unless their config names an EXECUTION_ENV_PATH.

    Without a tritonserver binary, print the container command instead, with the Triton release
    whose TensorRT matches the plans in REPO. Arguments after '--' go to tritonserver.

    REPO may be s3://BUCKET/PREFIX (with --s3-endpoint for an S3-compatible service): the server
    reads it with the AWS credentials of this environment.
    """

    from ..objectstore import list_remote, parse_url, snapshot  # noqa: PLC0415  # deferred: --help imports every command module; the stage loads only when the command runs
    from ..repository import list_repository, load_problems  # noqa: PLC0415  # deferred: --help imports every command module; the stage loads only when the command runs
    from ..server import (  # noqa: PLC0415  # deferred: --help imports every command module; the stage loads only when the command runs
        ServerError,
        TritonServer,
        check_distinct_ports,
        container_command,
        find_server_binary,
        log_errors,
        runnable_server_binary,
    )

    if not (timeout > 0 and math.isfinite(timeout)):
        raise UsageError(f"--timeout {timeout}: a positive number of seconds")
    if not host.strip():
        raise UsageError("--host: empty (give an address to listen on, e.g. 127.0.0.1)")
    remote = is_remote(repo)
    names: list[str] = []
    problems: list[tuple[str, str]]  # folders tritonserver would refuse to start on: said before it starts
    if remote:  # tritonserver reads the object storage itself (credentials from this environment)
        repo = parse_url(repo, s3_endpoint).url
        entries = list_remote(repo)  # fails here on credentials, endpoint or bucket
        names = [e.name for e in entries]
        problems = [(f"{repo}/{e.name}/", e.problem) for e in entries
                    if e.problem and e.problem.startswith("no config.pbtxt")]
    elif not Path(repo).is_dir():
        raise UsageError(f"{repo}: model repository not found (create one with 'trtrepo deploy')")
    else:  # hidden folders only in place: the copy a server gets by default leaves them out
        problems = [(str(p), why) for p, why in load_problems(repo) if in_place or not p.name.startswith(".")]
    for where, why in problems:
        click.echo(f"warning: {where}: {why}; 'trtrepo repo check --fix {repo}' repairs what an interrupted trtrepo "
                   f"write left", err=True)
    # a file that cannot run is named (with where it came from) unless only the command is printed
    binary = find_server_binary(server_binary) if print_command else runnable_server_binary(server_binary)
    if print_command or binary is None:
        if binary is None and server_binary:
            raise UsageError(f"--server-binary {server_binary}: not a file")
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
        return
    server = TritonServer(repo, binary=binary, host=host, http_port=http_port or None, grpc_port=grpc_port or None,
                          metrics_port=metrics_port or None, timeout=timeout, copy=not in_place, extra_args=server_args,
                          keep_log=True)
    server.start()
    for lo in server.reaped:
        click.echo(f"note: removed {lo.describe()}", err=True)
    try:
        # Before the lines that say it is ready: a signal sent on reading them must find the handlers.
        signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
        # Ctrl-C / kill -INT stop it even when started with SIGINT ignored (a background job of a
        # non-interactive shell): Python then installs no handler itself.
        signal.signal(signal.SIGINT, signal.default_int_handler)
        models = ", ".join(names if remote else [e.name for e in list_repository(repo)])
        click.echo(f"tritonserver ready: HTTP {server.http_url}  gRPC {server.grpc_url}  metrics {host}:{server.metrics_port}")
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
