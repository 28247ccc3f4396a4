"""Each public class and function of parallel_r1 has one import path.

A public module (no part of its dotted name starts with `_`) exports the names in its `__all__`; without `__all__`,
the public classes and functions it defines. A package and a module inside it are one home for a name the module
exports but does not list in an `__all__` of its own: the package is the module's public face (`ForkJoinEngine`,
defined in `parallel_r1.rollout.engine`, is exported by `parallel_r1.rollout`). Any other two modules that export
the same class or function give it two import paths, and fail.
"""

import importlib
import inspect
import pkgutil

import parallel_r1


def public_modules() -> list:
    names = [info.name for info in pkgutil.walk_packages(parallel_r1.__path__, "parallel_r1.")]
    public = [name for name in names if not any(part.startswith("_") for part in name.split("."))]
    return [parallel_r1, *(importlib.import_module(name) for name in public)]


def exports(module) -> dict[str, object]:
    """The classes and functions `module` exports, by name."""
    if hasattr(module, "__all__"):
        named = {name: getattr(module, name) for name in module.__all__}
    else:
        named = {
            name: value
            for name, value in vars(module).items()
            if not name.startswith("_") and getattr(value, "__module__", None) == module.__name__
        }
    return {name: value for name, value in named.items() if inspect.isclass(value) or inspect.isroutine(value)}


def one_home(outer: str, inner: str, listed: bool) -> bool:
    """Whether `outer` exporting what `inner` exports is the same home: `outer` is a package above `inner`, and
    `inner` has no `__all__` that lists the name."""
    return inner.startswith(outer + ".") and not listed


def test_every_public_class_and_function_has_one_import_path():
    homes: dict[int, list] = {}  # id(object) -> [(module, name, listed in that module's __all__)]
    for module in public_modules():
        for name, value in exports(module).items():
            homes.setdefault(id(value), []).append((module.__name__, name, hasattr(module, "__all__")))
    twice = []
    for found in homes.values():
        for i, (a, name, a_listed) in enumerate(found):
            for b, _, b_listed in found[i + 1 :]:
                if not (one_home(a, b, b_listed) or one_home(b, a, a_listed)):
                    twice.append(f"{name}: {a} and {b}")
    assert not twice, "exported from two modules:\n" + "\n".join(sorted(twice))


def test_a_class_exported_twice_is_caught():
    """The rule fails on what it should: a package re-exporting a class of another package, or of a submodule that
    lists it in its own `__all__`."""
    assert not one_home("parallel_r1.trainers", "parallel_r1.configs", listed=False)
    assert not one_home("parallel_r1.rollout", "parallel_r1.rollout.engine", listed=True)
    assert one_home("parallel_r1.rollout", "parallel_r1.rollout.engine", listed=False)
