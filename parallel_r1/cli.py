"""How scripts end on a problem with the user's input: one line `error: ...` and exit code 2, no traceback; and
what they read of the command line before the parse (which loads torch and transformers: seconds)."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path

USER_ERRORS = (ValueError, FileNotFoundError)


def run(main: Callable[[], None]) -> None:
    """Call `main`; a ValueError or FileNotFoundError it raises (a bad setting, a missing file) becomes one line,
    unless PARALLEL_R1_TRACEBACK=1 asks for the traceback."""
    try:
        main()
    except USER_ERRORS as problem:
        if os.environ.get("PARALLEL_R1_TRACEBACK") == "1":
            raise
        print(f"error: {problem}", file=sys.stderr)
        sys.exit(2)


def check_model_path(name: str | None, what: str = "model") -> None:
    """Refuse an empty name, and a local folder that is not there at once, instead of letting transformers spend a
    minute asking the Hub for it and then blame the network. A name is local when it starts with `/`, `.` or `~`,
    has more than one `/`, or its first part is a folder here (`outputs/tiny-sft`); a Hub id (`Qwen/Qwen3-4B-Base`)
    is none of these."""
    if not name:
        raise ValueError(f"model_name_or_path is required (a Hub id or a local {what} folder)")
    path = Path(name).expanduser()
    local = name.startswith(("/", ".", "~")) or name.count("/") > 1 or Path(name.split("/")[0]).is_dir()
    if local and not path.exists():
        raise FileNotFoundError(f"{what} folder {name} does not exist (a Hub id is written owner/name)")


class OneLineErrors:
    """Put before an argparse parser class: a bad flag or value ends in one line `error: ...` (exit 2), as the
    scripts' other mistakes do, instead of argparse's usage page (`--help` prints it)."""

    def error(self, message: str):
        print(f"error: {message} (see --help)", file=sys.stderr)
        sys.exit(2)


def take_recipe(args: list[str]) -> tuple[list[str], str | None]:
    """The arguments without `--config FILE` (or `--config=FILE`), and FILE, checked: one, there, a file."""
    rest, recipes = [], []
    arguments = iter(args)
    for arg in arguments:
        if arg == "--config":
            recipes.append(next(arguments, None))
            if recipes[-1] is None:
                raise ValueError("--config needs a recipe file: --config RECIPE.yaml")
        elif arg.startswith("--config="):
            recipes.append(arg.removeprefix("--config="))
        else:
            rest.append(arg)
    if len(recipes) > 1:
        raise ValueError(f"--config is given {len(recipes)} times ({', '.join(recipes)}): give one recipe")
    if not recipes:
        return rest, None
    recipe = Path(recipes[0])
    if not recipe.exists():
        raise FileNotFoundError(f"recipe {recipe} does not exist")
    if not recipe.is_file():
        raise ValueError(f"recipe {recipe} is not a file (a YAML recipe, e.g. recipes/tiny/sft.yaml)")
    return rest, str(recipe)


def named_model(args: list[str]) -> str | None:
    """The model a command line names, read without the parse: the last `--model_name_or_path` (or
    `--model-name-or-path`) flag, else its recipe's `model_name_or_path`; None when neither names one (the parse
    decides then)."""
    rest, recipe = take_recipe(args)
    named = None
    for arg, value in zip(rest, [*rest[1:], None]):
        if arg in ("--model_name_or_path", "--model-name-or-path"):
            named = value
        elif arg.startswith(("--model_name_or_path=", "--model-name-or-path=")):
            named = arg.split("=", 1)[1]
    if named is not None or recipe is None:
        return named
    import yaml

    try:
        config = yaml.safe_load(Path(recipe).read_text(encoding="utf-8"))
    except (yaml.YAMLError, OSError, UnicodeDecodeError):
        return None  # the parse says what is wrong with the recipe
    value = config.get("model_name_or_path") if isinstance(config, dict) else None
    return value if isinstance(value, str) else None


def check_named_model(args: list[str] | None = None) -> None:
    """`check_model_path` on the model the command line (`sys.argv` by default) names, before the parse: a mistyped
    folder fails in a fraction of a second, not after the seconds of importing what the parse needs."""
    name = named_model(list(sys.argv[1:] if args is None else args))
    if name:
        check_model_path(name)
