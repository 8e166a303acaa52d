"""Where a model repository lives: a local folder, or an object-storage URL Triton reads itself.

The one owner of the URL rules that ``repository``, ``objectstore``, ``server`` and the commands
share (Triton's own forms: ``s3://BUCKET/PREFIX``, ``s3://http://HOST:PORT/BUCKET/PREFIX`` for an
S3-compatible endpoint, ``gs://BUCKET/PREFIX``, ``as://ACCOUNT/CONTAINER/PREFIX``).
"""

from __future__ import annotations

REMOTE_SCHEMES = ("s3://", "gs://", "as://")


def is_remote(repo: object) -> bool:
    """True for a repository given as an object-storage URL (``s3://``, ``gs://``, ``as://``)."""
    return isinstance(repo, str) and repo.startswith(REMOTE_SCHEMES)
