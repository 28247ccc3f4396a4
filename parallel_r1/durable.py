"""Work that survives a kill: append-only JSON-lines records, and the settings a folder was started with.

- `read_lines(path)`: the complete lines of a JSON-lines file. A last line without its newline (cut by a kill,
  or still being written) is left out.
- `AppendLog(path)`: appends records, one JSON line each. On opening it cuts such an unfinished line; every
  `write` ends with a flush and an fsync, so a record is either whole on disk or dropped by the next reader.
- `check_settings(folder, run, what, has_records)`: the first run in a folder writes its settings to `run.json`;
  once records exist, a later run must bring the same, or it is refused with the names of the settings that differ.
"""

from __future__ import annotations

import json
import os
from pathlib import Path


def read_lines(path: Path) -> list:
    """The complete JSON lines of a file (none if it does not exist). Lines end at `\n` only: a JSON string may
    hold U+2028 or U+0085, which `str.splitlines` would take for line ends."""
    path = Path(path)
    if not path.exists():
        return []
    raw = path.read_bytes()
    records = []
    for number, line in enumerate(raw[: raw.rfind(b"\n") + 1].split(b"\n"), start=1):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except ValueError as error:
            raise ValueError(f"{path}, line {number}, is not a JSON record ({error}): move the file away") from None
    return records


class AppendLog:
    """Append JSON records to one file; a single writer per file."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if self.path.exists():
            with self.path.open("r+b") as f:  # cut an unfinished last line in place; the rest is never rewritten
                size = f.seek(0, os.SEEK_END)
                if size and (f.seek(size - 1) is None or f.read(1) != b"\n"):
                    f.seek(0)
                    f.truncate(f.read().rfind(b"\n") + 1)
        self.file = self.path.open("a", encoding="utf-8")

    def write(self, records: list) -> None:
        for record in records:
            self.file.write(json.dumps(record, ensure_ascii=False) + "\n")
        self.file.flush()
        os.fsync(self.file.fileno())

    def close(self) -> None:
        self.file.close()

    def __enter__(self) -> AppendLog:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def check_settings(folder: Path, run: dict, what: str, has_records: bool) -> None:
    """Write `folder/run.json` (the flat dict `run`), or raise a ValueError naming the keys in which `run` differs
    from the one an earlier run wrote there. A folder without records yet (`has_records` false: an earlier run
    failed before its first one, say on a mistyped model path) takes the new settings."""
    folder, run = Path(folder), json.loads(json.dumps(run))  # as JSON reads it back: tuples are lists
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "run.json"
    if not path.exists() or not has_records:
        path.write_text(json.dumps(run, indent=2) + "\n")
        return
    before = json.loads(path.read_text())
    changed = [key for key in dict.fromkeys([*run, *before]) if before.get(key) != run.get(key)]
    if changed:
        raise ValueError(
            f"{folder} holds {what} with other settings ({', '.join(changed)}): resume it with the same "
            "arguments, or choose another output_dir"
        )
