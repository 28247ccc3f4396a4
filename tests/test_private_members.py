"""Every name our code takes from a library without the library's promise (`parallel_r1.private_names`) is where our
code expects it, in the installed versions."""

import dataclasses
import enum
import importlib
import inspect
import os
import re

import pytest
from trl import GRPOTrainer, SFTTrainer

from parallel_r1.private_names import KINDS, OPTIONAL, PRIVATE_NAMES
from parallel_r1.trainers import ParallelGRPOTrainer, ParallelSFTTrainer
from parallel_r1.trainers.card import ModelCardMixin
from parallel_r1.trainers.tag_rate import TagRateMixin

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
VLLM_NAMES = [entry for entry in PRIVATE_NAMES if entry.needs == "vllm"]
OTHER_NAMES = [entry for entry in PRIVATE_NAMES if entry.needs != "vllm"]
POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
BY_KEYWORD = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)


def name_of(entry) -> str:
    return f"{entry.owner.split('.')[-1]}.{entry.member}:{entry.kind.replace(' ', '-')}"


def resolve(path: str):
    """The object at a dotted path: its longest importable module, then attributes."""
    parts = path.split(".")
    for end in range(len(parts), 0, -1):
        module = ".".join(parts[:end])
        try:
            found = importlib.import_module(module)
        except ModuleNotFoundError as error:
            if error.name != module:
                raise  # the module is there, but something it imports is not
            continue
        for name in parts[end:]:
            found = getattr(found, name)
        return found
    raise ModuleNotFoundError(path)


def source(thing) -> str:
    return inspect.getsource(thing.fget if isinstance(thing, property) else thing)


def check_parameters(function, wanted: tuple, where: str) -> None:
    """The names before "/" lead the parameters (after self), in that order; the others are keyword parameters."""
    parameters = list(inspect.signature(function).parameters.values())
    if parameters and parameters[0].name == "self":
        parameters = parameters[1:]
    leading = list(wanted[: wanted.index("/")]) if "/" in wanted else []
    keywords = wanted[wanted.index("/") + 1 :] if "/" in wanted else wanted
    first = [p.name for p in parameters[: len(leading)] if p.kind in POSITIONAL]
    assert first == leading, f"{where}: the leading parameters are {first}, ours pass {leading}"
    by_keyword = {p.name for p in parameters if p.kind in BY_KEYWORD}
    missing = [name for name in keywords if name not in by_keyword]
    assert not missing, f"{where} takes no keyword {missing}"


def field_names(cls) -> set:
    if isinstance(cls, enum.EnumMeta):
        return set(cls.__members__)
    if dataclasses.is_dataclass(cls):
        return {field.name for field in dataclasses.fields(cls)}
    return set(getattr(cls, "__struct_fields__", ()))  # a msgspec struct (vLLM's SamplingParams)


def check(entry) -> None:
    where = f"{entry.owner}.{entry.member} ({entry.kind}: {entry.use})"
    kind, member, checks = entry.kind, entry.member, entry.checks
    if kind == "module":
        importlib.import_module(f"{entry.owner}.{member}")
        return
    owner = resolve(entry.owner)
    if kind == "foreign attribute":
        text = source(owner)
        for name in checks:
            pattern = rf"(?<![\w.]){re.escape(name)}\.{member}\s*(:[^=\n]*)?=[^=]"
            assert re.search(pattern, text), f"{entry.owner} no longer sets {name}.{member}: {where}"
        return
    if kind == "instance attribute":
        for method in checks:
            assigned = re.search(rf"self\.{member}\s*(:[^=\n]*)?(,[^=\n]*)?=[^=]", source(getattr(owner, method)))
            assert assigned, f"{entry.owner}.{method} no longer sets self.{member}: {where}"
        return
    if kind == "class attribute":
        assert member in vars(owner), f"{where} is gone"
        return
    if kind == "property":
        found = inspect.getattr_static(owner, member, None)
        assert isinstance(found, property), f"{where} is no longer a property"
        assert "setter" not in checks or found.fset is not None, f"{where} can no longer be set"
        return
    assert hasattr(owner, member), f"{where} is gone"
    found = getattr(owner, member)
    if kind in ("overridden method", "called method", "module global"):
        if kind != "module global" or checks:
            assert callable(found), f"{where} is not callable"
            check_parameters(found, checks, where)
        if kind == "overridden method":
            assert f"self.{member}(" in source(owner), f"{entry.owner} no longer calls self.{member}: {where}"
    elif kind == "fields":
        missing = set(checks) - field_names(found)
        assert not missing, f"{where} has no {sorted(missing)}"
    elif kind == "output keys":
        text = source(found)
        missing = [key for key in checks if f'"{key}"' not in text and f"'{key}'" not in text]
        assert not missing, f"{where} no longer writes {missing}"
    else:
        assert kind == "call convention", kind
        text = source(found)
        missing = [snippet for snippet in checks if snippet not in text]
        assert not missing, f"{where}: its source no longer has {missing}"


@pytest.mark.parametrize("entry", OTHER_NAMES, ids=[name_of(e) for e in OTHER_NAMES])
def test_the_name_is_where_ours_expects_it(entry):
    if entry.needs is not None and not IN_CI:  # in CI a missing extra is a failure
        pytest.importorskip(entry.needs, reason=f"{entry.needs} is not installed (pip install -e .[{entry.needs}])")
    check(entry)


@pytest.mark.vllm
@pytest.mark.parametrize("entry", VLLM_NAMES, ids=[name_of(e) for e in VLLM_NAMES])
def test_the_vllm_name_is_where_ours_expects_it(entry):
    check(entry)


def test_the_registry_is_well_formed():
    seen = set()
    for entry in PRIVATE_NAMES:
        assert entry.kind in KINDS and entry.use, entry
        assert entry.needs in (None, *OPTIONAL), entry
        assert entry.library not in OPTIONAL or entry.needs == entry.library, f"{name_of(entry)} needs {entry.library}"
        takes_checks = entry.kind not in ("class attribute", "module", "property", "called method", "module global")
        assert entry.checks or not takes_checks, f"{name_of(entry)} checks nothing"
        assert name_of(entry) not in seen, f"{name_of(entry)} is listed twice"
        seen.add(name_of(entry))


def accepted(ours, theirs) -> list[str]:
    """The parameters of the parent's method `theirs` that our override `ours` would not take as the parent passes
    them (by position where it may, by keyword where it may)."""
    mine = list(inspect.signature(ours).parameters.values())[1:]
    positional = [p.name for p in mine if p.kind in POSITIONAL]
    star = any(p.kind is inspect.Parameter.VAR_POSITIONAL for p in mine)
    stars = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in mine)
    by_keyword = {p.name for p in mine if p.kind in BY_KEYWORD}
    refused = []
    for index, parameter in enumerate(list(inspect.signature(theirs).parameters.values())[1:]):
        if parameter.kind is inspect.Parameter.VAR_POSITIONAL:
            ok = star
        elif parameter.kind is inspect.Parameter.VAR_KEYWORD:
            ok = stars
        elif parameter.kind is inspect.Parameter.KEYWORD_ONLY:
            ok = parameter.name in by_keyword or stars
        elif index < len(positional):
            ok = positional[index] == parameter.name
        else:
            ok = star and (stars or parameter.kind is inspect.Parameter.POSITIONAL_ONLY)
        if not ok:
            refused.append(parameter.name)
    return refused


def test_every_override_of_a_private_method_is_listed():
    """Each private method of TRL's trainers (or their parents) that our trainers or the mixins they use override is
    listed as an `overridden method` of the class that defines it, and our override takes what the parent passes."""
    listed = [(resolve(e.owner), e.member) for e in PRIVATE_NAMES if e.kind == "overridden method"]
    for ours in (ParallelGRPOTrainer, ParallelSFTTrainer, TagRateMixin, ModelCardMixin):
        for parent in (GRPOTrainer, SFTTrainer):
            for name, override in vars(ours).items():
                if not (name.startswith("_") and not name.startswith("__") and hasattr(parent, name)):
                    continue
                assert any(member == name and owner in parent.__mro__ for owner, member in listed), (
                    f"{ours.__name__}.{name} overrides a private method of {parent.__name__}: list it in "
                    "parallel_r1/private_names.py"
                )
                refused = accepted(override, getattr(parent, name))
                assert not refused, f"{ours.__name__}.{name} does not take {refused} as {parent.__name__} passes them"
