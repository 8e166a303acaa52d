"""Triton model configuration: value objects, rendering through jinja2 templates, validation.

Python decides every value (:func:`config_from_io` turns a :class:`~trtrepo.modelio.ModelIO`
plus :class:`ModelOptions` into a :class:`ModelConfig`); the templates in the top-level
``templates/`` folder (package ``trtrepo.templates``) hold only the layout. Every rendered
text goes through :func:`validate_config_text` before anything is written: it is parsed with
protobuf ``text_format`` into Triton's own ``ModelConfig`` message (the schema check: unknown
fields and wrong types fail) and then checked the way Triton checks a config at load time
(:func:`check_config`). Every error is a one-line :class:`~trtrepo.errors.UsageError` that
names the model and the field.
"""


from .check import (
    check_config,
    check_rendered,
    config_to_dict,
    parse_config_text,
    validate_config_text,
)
from .model import (
    DETECTIONS,
    ENV_ARCHIVE_SUFFIXES,
    IMAGE_HW,
    INSTANCE_KINDS,
    LETTERBOX,
    MAX_INSTANCE_COUNT,
    MODEL_DIRECTORY,
    NAME_RE,
    CudaOptimization,
    DynamicBatching,
    EnsembleStep,
    InstanceGroup,
    ModelConfig,
    ModelOptions,
    NmsSettings,
    TensorConfig,
    VersionPolicy,
    Warmup,
    WarmupInput,
    check_model_name,
    config_from_io,
    detector_ensemble_config,
    ensemble_config,
    execution_env_files,
    execution_env_value,
    execution_env_warning,
    is_env_archive,
    postprocess_config,
    preprocess_config,
)
from .render import (
    pbstr,
    render_config,
    shipped_templates_dir,
    template_environment,
    template_file,
)

__all__ = [
    "DETECTIONS", "ENV_ARCHIVE_SUFFIXES", "IMAGE_HW", "INSTANCE_KINDS", "LETTERBOX", "MAX_INSTANCE_COUNT", "MODEL_DIRECTORY", "NAME_RE", "CudaOptimization",
    "DynamicBatching", "EnsembleStep", "InstanceGroup", "ModelConfig", "ModelOptions", "NmsSettings", "TensorConfig", "VersionPolicy",
    "Warmup", "WarmupInput", "check_config", "check_model_name", "check_rendered", "config_from_io", "config_to_dict",
    "detector_ensemble_config", "ensemble_config", "execution_env_files", "execution_env_value", "execution_env_warning", "is_env_archive",
    "parse_config_text", "pbstr", "postprocess_config", "preprocess_config", "render_config", "shipped_templates_dir", "template_environment",
    "template_file", "validate_config_text",
]
