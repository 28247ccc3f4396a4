"""The `Parameters:` section of a settings dataclass's docstring, written from its fields' help, in TRL's style, so
that `help(RolloutArguments)` and an editor show every setting with its type, default and meaning."""

import dataclasses
import re
import textwrap

INDENT = " " * 4
WIDTH = 119


def document_parameters(cls: type) -> type:
    """Append to `cls.__doc__` one entry per field that `cls` itself declares with a help text (inherited fields are
    documented on the class that declares them); returns `cls`, so it can decorate a dataclass."""
    own = cls.__dict__.get("__annotations__", {})
    entries = []
    for f in dataclasses.fields(cls):
        if f.name not in own or "help" not in f.metadata:
            continue
        head = f"{INDENT}{f.name} (`{_type_name(f.type)}`{_default(f)}):"
        body = textwrap.fill(f.metadata["help"], WIDTH, initial_indent=INDENT * 2, subsequent_indent=INDENT * 2)
        entries.append(f"{head}\n{body}")
    if entries:
        cls.__doc__ = f"{(cls.__doc__ or cls.__name__).rstrip()}\n\nParameters:\n" + "\n".join(entries) + "\n"
    return cls


def _type_name(annotation) -> str:
    if isinstance(annotation, str):
        return annotation
    if isinstance(annotation, type):
        return annotation.__name__
    return re.sub(r"\btyping\.", "", str(annotation))


def _default(f: dataclasses.Field) -> str:
    if f.default is not dataclasses.MISSING:
        return f", defaults to `{f.default!r}`"
    if f.default_factory is not dataclasses.MISSING:
        return f", defaults to `{f.default_factory()!r}`"
    return ""
