"""Triton model repositories: the only package that knows ``REPO/NAME/VERSION/model.<ext>``.

:func:`add_model` renders a :class:`~trtrepo.tritonconfig.ModelConfig`, validates the text
(protobuf schema + Triton's load-time rules, against the model file's IO) and only then writes;
a new version number is allocated unless ``version`` is given (1 .. 2**63-1, Triton's int64);
an existing version is never replaced without ``force``; a file lock (``REPO/.trtrepo.lock``)
serialises concurrent writers. Every intermediate state of a write is a repository Triton serves
(the commit protocol: :mod:`trtrepo.repository.commit`'s docstring).

The modules, top to bottom (the layers contract in ``pyproject.toml``):

- ``models``: the usual models (:func:`add_onnx_model`, :func:`add_plan_model`,
  :func:`add_image_ensemble`, :func:`add_detector_ensemble`);
- ``write``: :func:`add_model` and :func:`replace_config`: checks, version numbers, then the commit;
- ``commit``: the commit protocol, its lock (:func:`repository_lock`) and recovery
  (:func:`recover`, :func:`leftovers`);
  ``check``: portability (:func:`host_specific`, ``trtrepo repo check``);
  ``loads``: the model file tried with the runtime that will serve it, in a child process
  (:func:`check_model_loads` before a write, :func:`runtime_problems` for ``repo check``);
- ``layout``: the layout read back (:func:`versions_of`, :func:`read_config`,
  :func:`list_repository`) and what Triton needs to load a model folder (:func:`load_problems`).
"""

from __future__ import annotations

from .check import Finding, host_specific
from .commit import COMMIT_STEPS, LOCK_TIMEOUT_S, leftover_note, leftovers, recover, repository_lock
from .layout import (
    LOCK_NAME,
    MAX_VERSION,
    STAGING_NAME,
    FileSource,
    ModelEntry,
    PlanTarget,
    WriteResult,
    check_plan_target,
    config_io,
    files_needed,
    incomplete_versions,
    list_repository,
    load_problems,
    read_config,
    served_versions,
    versions_of,
)
from .loads import LoadCheck, LoadResult, check_file_loads, check_model_loads, runtime_problems, try_load, type_problem
from .models import (
    add_detector_ensemble,
    add_image_ensemble,
    add_onnx_model,
    add_plan_model,
    external_data_files,
    labels_bytes,
    postprocess_package_files,
    preprocess_package_files,
)
from .write import add_model, replace_config

__all__ = [
    "COMMIT_STEPS",
    "LOCK_NAME",
    "LOCK_TIMEOUT_S",
    "LoadCheck",
    "LoadResult",
    "MAX_VERSION",
    "STAGING_NAME",
    "FileSource",
    "Finding",
    "ModelEntry",
    "WriteResult",
    "add_detector_ensemble",
    "add_image_ensemble",
    "add_model",
    "add_onnx_model",
    "add_plan_model",
    "PlanTarget",
    "check_file_loads",
    "check_model_loads",
    "check_plan_target",
    "config_io",
    "external_data_files",
    "files_needed",
    "host_specific",
    "incomplete_versions",
    "labels_bytes",
    "leftover_note",
    "leftovers",
    "list_repository",
    "load_problems",
    "postprocess_package_files",
    "preprocess_package_files",
    "read_config",
    "recover",
    "replace_config",
    "repository_lock",
    "runtime_problems",
    "served_versions",
    "try_load",
    "type_problem",
    "versions_of",
]
