"""How scripts end on a problem with the user's input: one line `error: ...` and exit code 2, no traceback."""

from __future__ import annotations

import sys
from collections.abc import Callable

USER_ERRORS = (ValueError, FileNotFoundError)


def run(main: Callable[[], None]) -> None:
    """Call `main`; a ValueError or FileNotFoundError it raises (a bad setting, a missing file) becomes one line."""
    try:
        main()
    except USER_ERRORS as problem:
        print(f"error: {problem}", file=sys.stderr)
        sys.exit(2)
