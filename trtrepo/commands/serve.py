"""``trtrepo serve``."""

from __future__ import annotations

import click

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

    from ._serving import ServeArgs, serve  # noqa: PLC0415  # deferred: --help imports every command module; the server stage loads only when the command runs

    serve(ServeArgs(repo, s3_endpoint, server_binary, host, (http_port, grpc_port, metrics_port), timeout, in_place,
                    print_command, server_args))
