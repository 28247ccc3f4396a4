"""How scripts end on a problem with the user's input: one line `error: ...` and exit code 2, no traceback."""

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
