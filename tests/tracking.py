"""The tracked runs' helpers: a launch's environment that logs to a trackio store of its own behind the network guard
(`offline/sitecustomize.py`), the requests the guard refused, and the store read back with trackio's own API (shared
by test_tracking.py, test_multiprocess.py and test_browser.py), and the store's dashboard served on localhost."""

from __future__ import annotations

import json
import math
import os
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

GUARD = Path(__file__).resolve().parent / "offline"  # holds the guard's sitecustomize.py
# trackio fixes its folder (TRACKIO_DIR) at import, so the store is read in a process of its own
READER = """
import json, sys
import trackio
from trackio.sqlite_storage import SQLiteStorage

project, store = sys.argv[1], {}
for run in trackio.Api().runs(project):
    scalars, tables = [], {}
    for entry in SQLiteStorage.get_logs(project, run.name):
        scalars.append({k: v for k, v in entry.items() if isinstance(v, (int, float)) and not isinstance(v, bool)})
        for name, value in entry.items():
            if isinstance(value, dict) and value.get("_type") == "trackio.table":
                tables.setdefault(name, []).extend(value["_value"])
    store[run.name] = {"config": run.config, "scalars": scalars, "tables": tables}
print(json.dumps(store, default=str))
"""


def tracked_env(store: Path, record: Path) -> dict:
    """What a launch adds to its environment to log to the trackio store `store`, offline as docs/runs.md says
    (HF_HUB_OFFLINE: without it `datasets` counts a load and huggingface_hub sends telemetry, neither of them
    trackio's), with the network guard writing what it refused to `record`."""
    path = os.pathsep.join(p for p in (str(GUARD), os.environ.get("PYTHONPATH", "")) if p)
    return {"TRACKIO_DIR": str(store), "HF_HUB_OFFLINE": "1", "PYTHONPATH": path, "NETWORK_RECORD": str(record)}


def refused(record: Path) -> list[str]:
    """The requests the guard refused (none when the file was never written)."""
    return record.read_text().splitlines() if record.exists() else []


def read_store(store: Path, project: str) -> dict:
    """run name -> {"config": the run's config, "scalars": the numbers of each logged entry in order (trackio's own
    `step` among them), "tables": name -> rows}."""
    env = {**os.environ, "TRACKIO_DIR": str(store)}
    done = subprocess.run(
        [sys.executable, "-c", READER, project], env=env, capture_output=True, text=True, check=True, timeout=120
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def metric_names(run: dict) -> set[str]:
    """The names of the scalars a trackio run holds."""
    return {name for entry in run["scalars"] for name in entry}


def not_in_store(run: dict, history: list[dict]) -> list[str]:
    """The trainer's logged numbers (`history`: trainer_state's entries, each with its `step`) that the trackio run
    lacks or holds with another value, as `step N: name`: the callback logs each as `train/<name>` with the
    trainer's step as `train/global_step`."""
    tracked = {}
    for entry in run["scalars"]:
        if "train/global_step" in entry:
            tracked.setdefault(entry["train/global_step"], {}).update(entry)
    wrong = []
    for entry in history:
        logged = tracked.get(entry["step"], {})
        for name, value in entry.items():
            if name != "step" and isinstance(value, (int, float)) and not isinstance(value, bool):
                if not math.isclose(logged.get(f"train/{name}", math.nan), value, rel_tol=1e-6, abs_tol=1e-9):
                    wrong.append(f"step {entry['step']}: {name}")
    return wrong


@contextmanager
def dashboard(store: Path, project: str, port: int, record: Path):
    """trackio's dashboard of `project` in `store`, served by trackio's own `show` on 127.0.0.1:`port` (no browser
    opened) in a process of its own behind the network guard; yields the page's URL; stopped afterwards."""
    serve = "import sys, trackio; trackio.show(sys.argv[1], server_port=int(sys.argv[2]), open_browser=False)"
    env = {**os.environ, **tracked_env(store, record)}
    process = subprocess.Popen(
        [sys.executable, "-c", serve, project, str(port)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT
    )
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert process.poll() is None, f"trackio show ended with exit code {process.returncode}"
                assert time.monotonic() < deadline, "the dashboard did not start in 120 s"
                time.sleep(0.2)
        yield f"http://127.0.0.1:{port}/?project={project}"
    finally:
        process.kill()
        process.wait()
