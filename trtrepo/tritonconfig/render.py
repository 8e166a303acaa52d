"""Rendering a :class:`~trtrepo.tritonconfig.model.ModelConfig` through the jinja2 templates
(layout only; ``pbstr`` escapes every value) with a user's ``--template-dir`` contained to its
folder."""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Any

from .. import __version__
from ..errors import OptionError, UsageError, one_line
from .model import ModelConfig


def pbstr(value: Any) -> str:
    """Quote a string for protobuf text format (C escapes; non-ASCII as octal UTF-8 bytes)."""
    out = ['"']
    for b in str(value).encode("utf-8"):
        ch = chr(b)
        if ch == '"':
            out.append('\\"')
        elif ch == "\\":
            out.append("\\\\")
        elif ch == "\n":
            out.append("\\n")
        elif 32 <= b < 127:
            out.append(ch)
        else:
            out.append(f"\\{b:03o}")
    out.append('"')
    return "".join(out)


def _pbbool(value: Any) -> str:
    return "true" if value else "false"


def template_environment(template_dir: str | Path | None = None, package_dir: str | Path | None = None) -> Any:
    """jinja2 environment with StrictUndefined; ``template_dir`` files override the shipped ones by name.
    ``package_dir``: a backend plug-in's own templates (``BackendSpec.template_dir``), between the
    two (the shipped ``_macros.j2`` stays reachable)."""
    import jinja2

    loaders: list[Any] = []
    if template_dir is not None:
        d = Path(template_dir)
        if not d.is_dir():
            raise OptionError("template_dir", f"{d}: not a directory", concept="the template folder")
        loaders.append(_contained_loader(d))
    if package_dir is not None:
        loaders.append(jinja2.FileSystemLoader(str(package_dir)))
    loaders.append(jinja2.FileSystemLoader(str(shipped_templates_dir())))
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    # Sandboxed: a --template-dir template can only read the config it is given (no attribute
    # walks to os/subprocess, no mutation); Python decides every value.
    env = ImmutableSandboxedEnvironment(
        loader=jinja2.ChoiceLoader(loaders),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        autoescape=False,
    )
    env.filters["pbstr"] = pbstr
    env.filters["pbbool"] = _pbbool
    env.globals["trtrepo_version"] = __version__
    return env


def _contained(folder: Path, name: str) -> Path | None:
    """``folder/name`` if it is a file inside ``folder`` reached without a symlink; None if absent.
    A symlink (or a ``..`` path) would let a template directory read any file of the host into a
    config or a model folder: refused."""
    p = folder / name
    if not p.exists() and not p.is_symlink():
        return None
    parts = Path(name).parts
    if ".." in parts or Path(name).is_absolute() or any((folder.joinpath(*parts[:i + 1])).is_symlink()
                                                        for i in range(len(parts))):
        raise OptionError("template_dir", f"{folder}: {name} is a symlink or leaves the folder; templates are read "
                                          f"only from files inside it", concept="the template folder")
    return p if p.is_file() else None


def _contained_loader(folder: Path) -> Any:
    """jinja2 loader of a ``--template-dir``: files inside the folder only (see :func:`_contained`)."""
    import jinja2

    class ContainedLoader(jinja2.BaseLoader):
        def get_source(self, environment: Any, template: str) -> tuple[str, str, Any]:
            p = _contained(folder, template)
            if p is None:
                raise jinja2.TemplateNotFound(template)
            mtime = p.stat().st_mtime
            return p.read_text(), str(p), lambda: p.exists() and p.stat().st_mtime == mtime

    return ContainedLoader()


def shipped_templates_dir() -> Path:
    return Path(str(resources.files("trtrepo.templates")))


def template_file(name: str, template_dir: str | Path | None = None, package_dir: str | Path | None = None) -> Path:
    """A non-jinja template file (the Python models), user's copy first, then a backend plug-in's
    (``package_dir``), then trtrepo's."""
    if template_dir is not None:
        mine = _contained(Path(template_dir), name)
        if mine is not None:
            return mine
    if package_dir is not None and (Path(package_dir) / name).is_file():
        return Path(package_dir) / name
    p = shipped_templates_dir() / name
    if not p.is_file():
        raise UsageError(f"template file {name} not found in {shipped_templates_dir()}")
    return p


def render_config(config: ModelConfig, template_dir: str | Path | None = None) -> str:
    import jinja2

    env = template_environment(template_dir, config.spec.template_dir)
    try:
        text: str = env.get_template(config.template).render(m=config)
    except jinja2.exceptions.SecurityError as exc:
        raise UsageError(f"template {config.template}: refused by the sandbox ({one_line(exc)}); templates only "
                         f"lay out the values trtrepo gives them") from exc
    except jinja2.TemplateError as exc:
        where = getattr(exc, "filename", None) or config.template
        line = getattr(exc, "lineno", None)
        loc = f"{where}:{line}" if line else where
        raise UsageError(f"template {loc}: {type(exc).__name__}: {one_line(exc)}") from exc
    except Exception as exc:  # an expression of the template failed (TypeError, ZeroDivisionError, ...)
        raise UsageError(f"template {config.template}: {type(exc).__name__}: {one_line(exc)}") from exc
    return text.rstrip() + "\n"


# --------------------------------------------------------------------------------------------
# Validation


