"""The tag rows' own learning rate under DeepSpeed: the hooks' traffic and time, before and after the rewrite.

    python benchmarks/bench_tag_rate.py        # 1 to 3 minutes on 2 CPU cores: benchmarks/results/tag_rate.md

`parallel_r1.trainers.tag_rate` scales each step of the tag rows with step hooks on the torch optimizer. Under
DeepSpeed that optimizer (the "basic" one) steps DeepSpeed's float32 copy, partitioned across processes, and
DeepSpeed calls its `step` once per parameter group (ZeRO-1/2) or sub-group (ZeRO-3): C calls an optimizer step
(2 with the Trainer's decay / no-decay groups). Two ways, on the same model, data and seed:

- old: the hooks of git HEAD before the rewrite (`FullGather` below, a minimal copy of them): at every one of the
  C calls, the pre hook reads each tag-holding tensor whole (`deepspeed.utils.safe_get_full_fp32_param`: a gather
  of the tensor on every process) and the post hook reads it whole again and writes it back
  (`safe_set_full_fp32_param`, which keeps this process's part). One change: the tensor is DeepSpeed's when it has
  `ds_id` or `_hp_mapping` at all; HEAD tested `_hp_mapping is not None`, so under ZeRO-1/2 a process holding none
  of the tensor skipped a gather the others joined: a hang, or, where every process skips one (the untied model
  under ZeRO-2 here), gathers paired across tensors, which corrupt the copy (main runs HEAD's test there too, with
  `--head-detection`, and reports it);
- new: the project's `TagRate(..., deepspeed=True)` (imported): each process changes, in place, the tag rows'
  elements in its own part of the float32 copy, in the one call that steps that part.

Each way runs in 2 processes on the CPU (torchrun, gloo), ZeRO-2 and ZeRO-3 in float32, on a one-layer Qwen3 of
vocabulary 1,001 x hidden 64, tied and untied, torch AdamW in the Trainer's two groups (`Trainer.
get_decay_parameter_names`; weight decay 0.1 / 0), `--steps` optimizer steps, six tag rows chosen to include the
rows that straddle two processes' parts (row 500 under ZeRO-3, row 788 in the tied model under ZeRO-2).

Measured, inside the way's own hook calls only (each hook the way registered is wrapped; the collectives are
counted by wrapping torch.distributed's, which deepspeed.comm calls): the collectives and their buffers' bytes,
the hooks' time. Checked, at every basic-optimizer call: the float32 copy after the call, gathered whole, equals
bitwise the copy the optimizer alone made with each tag row set to `before + k * (after - before)` (checking hooks
registered around the way's, outside what is measured); the tag rows' moves over the optimizer's are k; and at the
end, the old and the new way's float32 embeddings and heads, and their losses, are bitwise the same. The old way's
bytes are then computed at Qwen3-4B's shape with the formula the measurement checks (stated as computed).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from importlib.metadata import version
from pathlib import Path

import torch
from bench_common import cpu_machine, write_results

ROOT = Path(__file__).resolve().parents[1]
WAYS = ("old", "new")


def tags(vocab: int) -> list[int]:
    """Six tag rows: at 1,001 x 64, 500 is split by ZeRO-3 (64,064 / 2 = row 500.5), 788 by ZeRO-2 (tied model)."""
    return sorted({row for row in (0, 3, 500, 788, vocab - 2, vocab - 1) if 0 <= row < vocab})


COLLECTIVES = (
    "all_reduce",
    "all_gather_into_tensor",
    "_all_gather_base",
    "all_gather",
    "broadcast",
    "reduce_scatter_tensor",
    "_reduce_scatter_base",
    "reduce_scatter",
    "reduce",
    "all_to_all_single",
    "all_reduce_coalesced",
    "all_gather_coalesced",
)


# ---------------------------------------------------------------------------------------------------- the worker


class Meter:
    """What the wrapped hooks did: collectives (name, bytes of the buffer they fill) and seconds."""

    def __init__(self):
        self.active, self.collectives, self.seconds, self.calls = False, [], 0.0, 0

    def reset(self):
        self.collectives, self.seconds, self.calls = [], 0.0, 0


METER = Meter()


def count_collectives(tdist) -> None:
    """Wrap torch.distributed's collectives (before DeepSpeed binds any) to record those made inside a window."""

    def size(x) -> int:
        if hasattr(x, "element_size"):
            return x.numel() * x.element_size()
        return sum(size(t) for t in x) if isinstance(x, (list, tuple)) else 0

    def wrap(name, function):
        def counted(*args, **kwargs):
            if METER.active:  # all_reduce: the tensor; all_gather_into_tensor: the output (the first argument)
                METER.collectives.append((name, size(args[0] if args else next(iter(kwargs.values())))))
            return function(*args, **kwargs)

        return counted

    for name in COLLECTIVES:
        if hasattr(tdist, name):
            setattr(tdist, name, wrap(name, getattr(tdist, name)))


def measured(optimizer, make, *args):
    """`make(optimizer, *args)` registers step hooks on `optimizer`; each is replaced by itself inside the meter's
    window."""
    dicts = (optimizer._optimizer_step_pre_hooks, optimizer._optimizer_step_post_hooks)
    known = [set(hooks) for hooks in dicts]
    made = make(optimizer, *args)

    def window(hook):
        def run(*args, **kwargs):
            METER.active, start = True, time.perf_counter()
            try:
                return hook(*args, **kwargs)
            finally:
                METER.seconds += time.perf_counter() - start
                METER.active = False
                METER.calls += 1

        return run

    for hooks, old in zip(dicts, known):
        for key in [key for key in hooks if key not in old]:
            hooks[key] = window(hooks[key])
    return made


class FullGather:
    """The old way: git HEAD's hooks before the rewrite (module docstring), with `_deepspeed`'s test corrected."""

    def __init__(self, optimizer, rows, multiplier):
        self.rows, self.multiplier, self.before = rows, multiplier, []
        optimizer.register_step_pre_hook(self._remember)
        optimizer.register_step_post_hook(self._scale)

    def _remember(self, optimizer, args, kwargs) -> None:
        self.before = [_read(param)[rows].clone() for param, rows in self.rows]

    @torch.no_grad()
    def _scale(self, optimizer, args, kwargs) -> None:
        for (param, rows), before in zip(self.rows, self.before):
            value = _read(param)
            value[rows] = before + self.multiplier * (value[rows] - before)
            _write(param, value)
        self.before = []


def _read(param):
    from deepspeed.utils import safe_get_full_fp32_param

    return safe_get_full_fp32_param(param) if _deepspeed(param) else param.data


def _write(param, value) -> None:
    from deepspeed.utils import safe_set_full_fp32_param

    if _deepspeed(param):
        safe_set_full_fp32_param(param, value)


HEAD_DETECTION = False  # --head-detection: HEAD's own test, where the benchmark's "old" way corrects it


def _deepspeed(param) -> bool:
    if HEAD_DETECTION:
        return hasattr(param, "ds_id") or getattr(param, "_hp_mapping", None) is not None
    return hasattr(param, "ds_id") or hasattr(param, "_hp_mapping")


class Checker:
    """Hooks around the way's: at every basic-optimizer call, the whole float32 copy before, after the optimizer
    alone, and after the way's hook; the last must be the second with each tag row at `before + k * (after -
    before)`, bitwise. Their gathers lie outside the measured window."""

    def __init__(self, optimizer, rows, multiplier):
        self.rows, self.k = rows, multiplier
        self.equal, self.moved, self.worst_ratio, self.calls, self.error = True, 0, 0.0, 0, 0.0
        self.seconds = 0.0
        optimizer.register_step_pre_hook(self._before)
        optimizer.register_step_post_hook(self._plain)

    def last(self, optimizer) -> None:
        """Registered after the way's hooks."""
        optimizer.register_step_post_hook(self._check)

    def _full(self):
        from deepspeed.utils import safe_get_full_fp32_param

        return [safe_get_full_fp32_param(param).clone() for param, _ in self.rows]

    def _before(self, optimizer, args, kwargs) -> None:
        start = time.perf_counter()
        self.before = self._full()
        self.seconds += time.perf_counter() - start

    def _plain(self, optimizer, args, kwargs) -> None:
        start = time.perf_counter()
        self.after = self._full()
        self.seconds += time.perf_counter() - start

    def _check(self, optimizer, args, kwargs) -> None:
        start = time.perf_counter()
        self.calls += 1
        for (_, rows), before, plain, got in zip(self.rows, self.before, self.after, self._full()):
            expected = plain.clone()
            expected[rows] = before[rows] + self.k * (plain[rows] - before[rows])
            self.equal &= bool(got.equal(expected))
            self.error = max(self.error, (got - expected).abs().max().item())
            plain_move, move = plain[rows] - before[rows], got[rows] - before[rows]
            nonzero = plain_move != 0
            self.moved += int(nonzero.sum())
            if nonzero.any():
                ratio = move[nonzero] / plain_move[nonzero]
                self.worst_ratio = max(self.worst_ratio, (ratio - self.k).abs().max().item() / self.k)
        self.seconds += time.perf_counter() - start


def worker(args) -> None:
    import torch.distributed as tdist

    count_collectives(tdist)
    import deepspeed
    from deepspeed.utils import safe_get_full_fp32_param
    from transformers import Qwen3Config, Qwen3ForCausalLM, Trainer

    from parallel_r1.trainers.tag_rate import TagRate, tag_rows

    deepspeed.init_distributed(dist_backend="gloo")
    rank, world = tdist.get_rank(), tdist.get_world_size()
    config = {
        "train_micro_batch_size_per_gpu": 2,
        "gradient_accumulation_steps": 1,
        "gradient_clipping": 1.0,
        "zero_optimization": {"stage": args.stage},
        "zero_allow_untested_optimizer": True,
        "zero_force_ds_cpu_optimizer": False,
        "bf16": {"enabled": False},
        "steps_per_print": 10**9,
    }
    results, tag_ids = [], tags(args.vocab)
    global HEAD_DETECTION
    HEAD_DETECTION = args.head_detection
    for tied in (False,) if args.head_detection else (True, False):
        finals = {}
        for way in ("old",) if args.head_detection else WAYS:
            torch.manual_seed(0)
            model_config = Qwen3Config(
                vocab_size=args.vocab,
                hidden_size=args.hidden,
                intermediate_size=2 * args.hidden,
                num_hidden_layers=1,
                num_attention_heads=2,
                num_key_value_heads=1,
                head_dim=args.hidden // 2,
                tie_word_embeddings=tied,
            )
            if args.stage == 3:
                with deepspeed.zero.Init(config_dict_or_path=config):
                    model = Qwen3ForCausalLM(model_config)
            else:
                model = Qwen3ForCausalLM(model_config)
            decay = Trainer.get_decay_parameter_names(None, model)  # the Trainer's groups (self is not used)
            named = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
            groups = [
                {"params": [p for name, p in named if name in decay], "weight_decay": 0.1},
                {"params": [p for name, p in named if name not in decay], "weight_decay": 0.0},
            ]
            optimizer = torch.optim.AdamW(groups, lr=args.lr)
            rows = tag_rows(model, tag_ids)
            checker = Checker(optimizer, rows, args.multiplier)
            if way == "old":
                tag = measured(optimizer, FullGather, rows, args.multiplier)
            else:
                tag = measured(optimizer, TagRate, rows, args.multiplier, True)  # deepspeed=True
            checker.last(optimizer)
            calls = []
            optimizer.register_step_pre_hook(lambda *_, calls=calls: calls.append(1))
            engine, wrapped, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)
            assert wrapped.optimizer is optimizer, type(wrapped)

            generator = torch.Generator().manual_seed(rank)
            steps = []
            for _ in range(args.steps):
                ids = torch.randint(0, args.vocab, (2, 24), generator=generator)
                ids[0, 1 : 1 + len(tag_ids)] = torch.tensor(tag_ids)  # each tag row: a gradient in the embedding
                ids[1, ::4] = tag_ids[rank]
                loss = engine(input_ids=ids, labels=ids).loss
                engine.backward(loss)
                METER.reset()
                calls.clear()
                engine.step()
                steps.append(
                    {
                        "loss": loss.item(),
                        "calls": len(calls),
                        "hook_calls": METER.calls,
                        "hook_seconds": METER.seconds,
                        "collectives": list(METER.collectives),
                    }
                )
            layout = []
            if way == "new":  # where each tensor's part is on this process (the project's own `_Partition`)
                for holder, (param, _) in zip(tag.holders, rows):
                    part = holder._part()
                    shape = param.ds_shape if hasattr(param, "ds_id") else param.shape
                    layout.append(
                        {
                            "tensor": "embedding (tied head)" if tied else ("embedding", "head")[len(layout)],
                            "shape": list(shape),
                            "part": None if part is None else [part[1], part[0].numel()],
                        }
                    )
            finals[way] = [safe_get_full_fp32_param(param).clone() for param, _ in rows]
            results.append(
                {
                    "tied": tied,
                    "way": way,
                    "tensors": len(rows),
                    "steps": steps,
                    "equal": checker.equal,
                    "checked_calls": checker.calls,
                    "moved": checker.moved,
                    "worst_ratio": checker.worst_ratio,
                    "error": checker.error,
                    "layout": layout,
                }
            )
            engine.destroy()
            del engine, wrapped, optimizer, model, tag
        if args.head_detection:
            continue
        same = all(a.equal(b) for a, b in zip(finals["old"], finals["new"]))
        diff = max((a - b).abs().max().item() for a, b in zip(finals["old"], finals["new"]))
        losses = [[step["loss"] for step in result["steps"]] for result in results[-2:]]
        for result in results[-2:]:
            result["old_new_equal"], result["old_new_max_diff"] = same, diff
            result["old_new_losses"] = losses[0] == losses[1]
    Path(f"{args.json}.rank{rank}").write_text(json.dumps({"rank": rank, "world": world, "results": results}))
    tdist.barrier()
    tdist.destroy_process_group()


# ---------------------------------------------------------------------------------------------------- the report


def old_way(vocab, hidden, processes, stage, calls, tensors) -> dict:
    """The old way's traffic an optimizer step, per process: 2 * C * T gathers of a V x H float32 tensor. ZeRO-1/2
    gathers by an all_reduce of a zero-filled whole buffer (a ring sends 2 (n-1)/n of it), ZeRO-3 by an
    all_gather_into_tensor ((n-1)/n); the new way makes no collective and no whole buffer."""
    whole = vocab * hidden * 4
    gathers = 2 * calls * tensors
    share = 2 * (processes - 1) / processes if stage in (1, 2) else (processes - 1) / processes
    return {"gathers": gathers, "whole": whole, "buffer_bytes": gathers * whole, "sent": gathers * whole * share}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(args, stage: int, folder: Path, head: bool = False) -> list[dict] | str:
    """One torchrun of 2 processes for `stage`: both ways, tied and untied (`head`: HEAD's own detection, the old
    way, untied only); the processes' results, or (`head`) why there are none."""
    out = folder / f"zero{stage}{'-head' if head else ''}.json"
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        "2",
        "--master_port",
        str(free_port()),
        __file__,
        "--worker",
        "--stage",
        str(stage),
        "--json",
        str(out),
        "--steps",
        str(args.steps),
        "--vocab",
        str(args.vocab),
        "--hidden",
        str(args.hidden),
        "--multiplier",
        str(args.multiplier),
        "--lr",
        str(args.lr),
    ] + (["--head-detection"] if head else [])
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    log = out.with_suffix(".log")
    limit = 180 if head else 600  # HEAD's detection may hang (a process waiting in a gather the other skipped)
    with open(log, "w") as stream:
        process = subprocess.Popen(
            command, cwd=ROOT, env=env, stdout=stream, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            code = process.wait(timeout=limit)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)  # torchrun and its 2 processes (a session of their own)
            process.wait()
            code = f"hung: killed after {limit} s"
    if code and not head:
        sys.exit(f"ZeRO-{stage} run failed ({code}):\n" + log.read_text()[-6000:])
    if code:
        return f"failed ({code}): " + log.read_text()[-300:].replace("\n", " ")
    return [json.loads(Path(f"{out}.rank{r}").read_text()) for r in range(2)]


def each(results: list[dict], key: str) -> str:
    """A figure of each process, once when they agree."""
    return "/".join(f"{n:,}" for n in sorted({result[key] for result in results}))


def gb(n: float) -> str:
    return f"{n / 1e9:.2f} GB"


def kb(n: float) -> str:
    return f"{n / 1e3:,.1f} kB"


def report(args, runs: dict, head: list[dict] | str, seconds: float) -> str:
    lines = [
        "# The tag rows' rate under DeepSpeed: whole-tensor gathers in every hook (old) vs local parts (new)",
        "",
        f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC; {cpu_machine()}; Python {sys.version.split()[0]}, "
        f"DeepSpeed {version('deepspeed')}, transformers {version('transformers')}; 2 processes (torchrun, gloo, "
        "OMP_NUM_THREADS=1) a stage.",
        f"Command: `python benchmarks/bench_tag_rate.py --steps {args.steps}` ({seconds / 60:.1f} min).",
        "",
        f"Model: Qwen3, 1 layer, vocabulary {args.vocab:,} x hidden {args.hidden}, tied and untied head, float32; "
        f"torch AdamW (lr {args.lr}) in the Trainer's two groups (decay 0.1 / none), gradient clipping 1.0; "
        f"DeepSpeed `zero_optimization.stage` 2 or 3 (no offload), `deepspeed.initialize` on the basic optimizer "
        f"as accelerate does it; tag rows {tags(args.vocab)}, multiplier k = {args.multiplier:g}; {args.steps} optimizer steps "
        "of 2 sequences x 24 tokens on each process. Ways (module docstring): **old** = git HEAD's hooks "
        "(`safe_get_full_fp32_param` in both hooks, `safe_set_full_fp32_param` in the post hook, at every "
        "basic-optimizer call), with the tensor counted as DeepSpeed's whenever it has `_hp_mapping` (HEAD required "
        "it not None, which breaks where a process holds none of the tensor: the layout and HEAD's section below); **new** = "
        "`parallel_r1.trainers.tag_rate.TagRate(..., deepspeed=True)`.",
        "",
        "## Measured (inside the way's hooks only)",
        "",
        "Per optimizer step, on each process (both processes made the same collectives; C = basic-optimizer "
        "`step` calls a step, T = tag-holding tensors). Buffer bytes: what the collectives filled (the all_reduce's "
        "tensor, the all_gather's output), each a whole V x H float32 tensor; formula: 2 C T x V H 4 bytes for the "
        "old way, 0 for the new. Hook ms: the way's hooks' time in an optimizer step, the first step (the new way "
        "finds the parts there) and the median of the later ones over both processes; a collective's time includes "
        "waiting for the other process. Checked: every basic-optimizer call, on each process (each checks the "
        "whole tensors, gathered); bitwise: the float32 copy after the call equals the optimizer's own result with the tag rows at `before + k (after - before)`; "
        "moved: the tag-row elements the optimizer moved, summed over the calls (6 rows x H x steps when every "
        "one moves at every step), and the ratio of the way's move to "
        "the optimizer's on them (its spread is the float32 rounding of the two differences); old = new: the final "
        "float32 tensors and every step's loss, bitwise.",
        "",
        "| ZeRO | head | way | C | T | collectives a step | buffer bytes a step | formula | hook ms, step 1 | "
        "hook ms, median later | checked calls | bitwise | moved: elements, ratio | old = new |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    layouts = []
    for stage, processes in runs.items():
        for index, result in enumerate(processes[0]["results"]):
            both = [p["results"][index] for p in processes]
            names = sorted({name for p in both for step in p["steps"] for name, _ in step["collectives"]})
            per_step = [step for p in both for step in p["steps"]]
            buffers = {sum(b for _, b in step["collectives"]) for step in per_step}
            calls, t = {step["calls"] for step in per_step}, result["tensors"]
            expected = old_way(args.vocab, args.hidden, 2, stage, max(calls), t)["buffer_bytes"]
            expected = expected if result["way"] == "old" else 0
            first = statistics.mean(p["steps"][0]["hook_seconds"] for p in both)
            later = statistics.median(s["hook_seconds"] for p in both for s in p["steps"][1:])
            same = result["old_new_equal"] and all(p["old_new_losses"] for p in both)
            counts = "/".join(map(str, sorted({len(step["collectives"]) for step in per_step})))
            lines.append(
                f"| {stage} | {'tied' if result['tied'] else 'untied'} | {result['way']} | "
                f"{'/'.join(map(str, sorted(calls)))} | {t} | {counts}{' ' + ', '.join(names) if names else ''} | "
                f"{'/'.join(f'{b:,}' for b in sorted(buffers))} | {expected:,}"
                f"{'' if buffers == {expected} else ' (DIFFERS)'} | {first * 1e3:.2f} | {later * 1e3:.2f} | "
                f"{each(both, 'checked_calls')} | {'yes' if all(p['equal'] for p in both) else 'NO'} | "
                f"{each(both, 'moved')}, {args.multiplier:g} +- "
                f"{max(p['worst_ratio'] for p in both) * args.multiplier:.0e} | "
                f"{'yes' if same else 'NO (max diff ' + format(result['old_new_max_diff'], '.1e') + ')'} |"
            )
            if result["way"] == "new":
                layouts.append((stage, result["tied"], [p["results"][index]["layout"] for p in processes]))
    lines += [
        "",
        "Where each process's part of the tag-holding tensors lies (flat element ranges of the new way's `_Partition`) "
        "and the tag rows split between two processes' parts:",
        "",
        "| ZeRO | head | tensor | process 0 | process 1 | split tag rows | HEAD's detection |",
        "|---|---|---|---|---|---|---|",
    ]
    for stage, tied, per_process in layouts:
        for i, tensor in enumerate(per_process[0]):
            parts = [p[i]["part"] for p in per_process]
            width = tensor["shape"][1]
            bounds = {b for part in parts if part for b in (part[0], part[0] + part[1])}
            split = [r for r in tags(args.vocab) if any(r * width < b < (r + 1) * width for b in bounds)]
            none = [str(n) for n, part in enumerate(parts) if part is None]
            detect = (
                f"process {', '.join(none)} holds none: HEAD's test skips the gather there"
                if none and stage != 3
                else "fine"
            )
            cells = [f"[{p[0]:,}, {p[0] + p[1]:,})" if p else "none" for p in parts]
            lines.append(
                f"| {stage} | {'tied' if tied else 'untied'} | {tensor['tensor']} {tuple(tensor['shape'])} | "
                f"{cells[0]} | {cells[1]} | {', '.join(map(str, split)) or '-'} | {detect} |"
            )
    lines += [
        "",
        "## HEAD as it was (its own detection), ZeRO-2, untied",
        "",
        "The old way once more, with HEAD's test of `_hp_mapping is not None`, where process 0 holds all of the "
        "embedding and none of the head, and process 1 the reverse (layout above). Each process gathers the tensor "
        "it holds and skips the other, so their two all_reduces (of the same size) pair up across tensors: no hang "
        "here, but each process's 'whole tensor' is the embedding plus the head (`get_full_hp_param` sums the "
        "processes' zero-filled buffers), and the post hook's `safe_set_full_fp32_param` writes that sum over the "
        "process's whole part, not only the tag rows. With a layout where only one process lacks a part, the other "
        "waits in a gather nobody joins (the hang). The checks are the same as above.",
        "",
    ]
    if isinstance(head, str):
        lines.append(f"Run: {head}")
    else:
        corrected = {p["rank"]: next(r for r in p["results"] if not r["tied"] and r["way"] == "old") for p in runs[2]}
        lines += [
            "| process | collectives a step | checked calls | bitwise | largest error in the float32 copy | "
            f"losses, steps 1-{args.steps} | the corrected old way's losses |",
            "|---|---|---|---|---|---|---|",
        ]

        def losses(result) -> str:
            return ", ".join(f"{step['loss']:.2f}" for step in result["steps"])

        for p in head:
            (result,) = p["results"]
            counts = sorted({len(step["collectives"]) for step in result["steps"]})
            lines.append(
                f"| {p['rank']} | {'/'.join(map(str, counts))} | {result['checked_calls']} | "
                f"{'yes' if result['equal'] else 'NO'} | {result['error']:.3g} | "
                f"{losses(result)} | {losses(corrected[p['rank']])} |"
            )
    lines += [
        "",
        "## Computed at Qwen3 shapes (not measured): the old way's traffic, per process, per optimizer step",
        "",
        "From the formula the table above checks (C = 2: the Trainer's two groups; ZeRO-3 with its default "
        "`sub_group_size` of 1e9 makes one sub-group a group here, more sub-groups make C larger): 2 C T gathers, "
        "each of a whole V x H float32 tensor, which each process materialises (one at a time: the peak is one "
        "extra whole float32 tensor a process, on its accelerator: both of DeepSpeed's gathers build it on the "
        "parameter's device). "
        "Bytes sent: a ring's share, 2 (n-1)/n of the buffer for ZeRO-1/2's all_reduce, (n-1)/n for ZeRO-3's "
        "all_gather. The new way: 0 collectives, 0 whole buffers (it indexes the 6 x H elements in its own part).",
        "",
        "| shape | head | processes | ZeRO | gathers a step (old) | whole buffers a step (old), each | "
        "sent by each process (old) | by all processes (old) | new |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for hidden, tensors, name in (
        (2560, 1, "151,936 x 2,560 (Qwen3-4B)"),
        (4096, 1, "151,936 x 4,096"),
        (4096, 2, "151,936 x 4,096 (Qwen3-8B)"),
    ):
        for stage in (2, 3):
            f = old_way(151_936, hidden, 8, stage, 2, tensors)
            lines.append(
                f"| {name} | {'tied' if tensors == 1 else 'untied'} | 8 | {stage} | {f['gathers']} | "
                f"{f['gathers']} x {gb(f['whole'])} = {gb(f['buffer_bytes'])} | {gb(f['sent'])} | "
                f"{gb(f['sent'] * 8)} | 0 |"
            )
    small = old_way(args.vocab, args.hidden, 2, 2, 2, 1)
    lines += [
        "",
        f"At this benchmark's shape the whole tensor is {kb(small['whole'])}, so the old hooks' time above is "
        "mostly gloo's per-collective latency on one machine; at Qwen3-4B's it is 1.56 GB a gather, moved "
        "2 C T times a step.",
        "",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--vocab", type=int, default=1001)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--multiplier", type=float, default=10.0)
    parser.add_argument("--lr", type=float, default=1e-2)
    parser.add_argument("--out", default="benchmarks/results/tag_rate.md")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--stage", type=int, default=3, help=argparse.SUPPRESS)
    parser.add_argument("--json", help=argparse.SUPPRESS)
    parser.add_argument("--head-detection", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    started = time.time()
    with tempfile.TemporaryDirectory() as folder:
        runs = {stage: launch(args, stage, Path(folder)) for stage in (2, 3)}
        head = launch(args, 2, Path(folder), head=True)
    torch.set_num_threads(1)  # the header's thread count: the workers' (OMP_NUM_THREADS=1)
    write_results(ROOT / args.out, report(args, runs, head, time.time() - started))


if __name__ == "__main__":
    main()
