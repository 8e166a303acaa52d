"""Option decorators shared by several commands."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click

F = TypeVar("F", bound=Callable[..., Any])


def not_empty(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """A data spec given as ``''`` is refused (a path of ``''`` would read as the working folder)."""
    if value is not None and not value.strip():
        raise click.BadParameter("an empty value (expected a folder, .npy, .npz, 'module:callable' or demo:SPLIT)")
    return value


def data_options(required: bool = True, batch_size: int = 32) -> Callable[[F], F]:
    """``--data --preprocess --labels --limit --seed --batch-size --skip-non-images``."""

    def deco(f: F) -> F:
        opts = [
            click.option("--data", "data_spec", required=required, metavar="SPEC", callback=not_empty,
                         help="Data: demo:calib|demo:val, an image folder, .npy/.npz, or package.module:callable."),
            click.option("--preprocess", "preprocess", type=click.Path(dir_okay=False), default=None,
                         help="Preprocessing spec (JSON/YAML, see 'trtrepo preprocess'); required for image folders."),
            click.option("--labels", type=click.Path(dir_okay=False), default=None,
                         help="Integer labels (.npy or text, one per sample)."),
            click.option("--limit", type=click.IntRange(min=1), default=None, help="Use N samples (a deterministic subset)."),
            click.option("--seed", type=click.IntRange(min=0), default=0, show_default=True, help="Seed of the --limit subset."),
            click.option("--batch-size", type=click.IntRange(min=1), default=batch_size, show_default=True),
            click.option("--skip-non-images", is_flag=True,
                         help="Skip files of an image folder that are not images (by extension, or a header that "
                              "does not read as an image; named in a warning); without it such a file is an error."),
        ]
        for o in reversed(opts):
            f = o(f)
        return f

    return deco


s3_endpoint_option = click.option(
    "--s3-endpoint", default=None, metavar="URL",
    help="http(s)://HOST:PORT of an S3-compatible service for an s3:// repository (default: AWS, or "
         "$AWS_ENDPOINT_URL_S3 / $AWS_ENDPOINT_URL). Credentials: boto3's chain (AWS_ACCESS_KEY_ID, ...).")
