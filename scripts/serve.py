"""Serve a trained model behind the OpenAI API, sampled with the structure and settings it was trained with.

    python scripts/serve.py --model_name_or_path outputs/tiny-grpo                       # transformers, port 8000
    python scripts/serve.py --model_name_or_path <model> --backend vllm --port 8000       # an offline vLLM engine

Then any OpenAI client talks to it:

    from openai import OpenAI
    client = OpenAI(base_url="http://127.0.0.1:8000/v1", api_key="none")
    client.chat.completions.create(model="tiny-grpo", messages=[{"role": "user", "content": "What is 2 + 3?"}])

Requests are decoded together as they arrive (`parallel_r1.serving.scheduler`); the API and what a response holds
are in `parallel_r1.serving.api` and docs/serving.md. Any rollout setting can be overridden (--max_paths 3 ...), and
`--rollout_mode plain` serves the same model without its structure (plain text, as `vllm serve` would decode it).
SIGTERM or Ctrl-C drains: the requests in flight finish, new ones are refused, then the server exits.
"""

import sys
from dataclasses import dataclass, field, fields
from pathlib import Path

from transformers import HfArgumentParser

from parallel_r1.cli import OneLineErrors, run
from parallel_r1.configs import refuse_renamed_settings
from parallel_r1.docstrings import document_parameters
from parallel_r1.rollout.arguments import BackendArguments, RecordedRolloutArguments, SamplingArguments


class ArgumentParser(OneLineErrors, HfArgumentParser):
    """transformers' parser; a bad flag or value ends in one line."""


@document_parameters
@dataclass(kw_only=True)
class ServeArguments(RecordedRolloutArguments, SamplingArguments, BackendArguments):
    """What to serve, where, and how much at once; a rollout setting left unset is the model's recorded one, and a
    request's unset temperature or top_p is the one given here."""

    model_name_or_path: str = field(metadata={"help": "A trained model folder or Hub id."})
    served_model_name: str | None = field(
        default=None,
        metadata={"help": "The name clients give as `model` (default: the folder's or Hub id's last part)."},
    )
    host: str = field(default="127.0.0.1", metadata={"help": "Address to listen on (0.0.0.0: every interface)."})
    port: int = field(default=8000, metadata={"help": "Port to listen on."})
    max_running: int = field(default=64, metadata={"help": "Completions decoded at once (a request of n takes n)."})
    max_waiting: int = field(
        default=256, metadata={"help": "Requests that may wait for a slot; one more is answered 429."}
    )
    drain_timeout: int = field(
        default=600, metadata={"help": "Seconds a shutdown waits for the requests in flight before it cuts them."}
    )

    def __post_init__(self):
        """The bases' checks: no dataclass's __post_init__ calls another's."""
        RecordedRolloutArguments.__post_init__(self)
        SamplingArguments.__post_init__(self)
        BackendArguments.__post_init__(self)
        if self.max_running < 1 or self.max_waiting < 0:
            raise ValueError(
                f"max_running must be >= 1 and max_waiting >= 0, got {self.max_running}, {self.max_waiting}"
            )
        if not 0 <= self.port < 65536:
            raise ValueError(f"port must be in [0, 65535], got {self.port}")


def main() -> None:
    refuse_renamed_settings(sys.argv[1:], recipe=None)
    (args,) = ArgumentParser(ServeArguments).parse_args_into_dataclasses()
    import uvicorn

    from parallel_r1.cli import check_model_path
    from parallel_r1.policy import ParallelPolicy
    from parallel_r1.rollout.arguments import SamplingArguments
    from parallel_r1.serving import Scheduler, Served, context_length, create_app

    check_model_path(args.model_name_or_path)
    overrides = {f.name: getattr(args, f.name) for f in fields(RecordedRolloutArguments)}
    sampling = SamplingArguments(temperature=args.temperature, top_p=args.top_p, seed=args.seed)
    policy = ParallelPolicy.from_pretrained(args.model_name_or_path, sampling=sampling, **overrides)

    def engine():  # built in the scheduler's thread, which alone decodes
        backend = policy.open_backend(args.model_name_or_path, args, policy.sampling(args.seed),
                                      batch_size=args.max_running)  # fmt: skip
        return policy.engine(backend)

    def decode(ids) -> str:  # the tags kept
        return policy.tokenizer.decode(list(ids), skip_special_tokens=True)

    scheduler = Scheduler(engine, decode, args.max_running, args.max_waiting, args.seed).start()
    name = args.served_model_name or Path(args.model_name_or_path.rstrip("/")).name
    served = Served(policy, scheduler, name, policy.sampling(args.seed), context_length(args.model_name_or_path, args))
    print(
        f"serving {name!r} ({policy.settings.rollout_mode} rollouts) on http://{args.host}:{args.port}/v1", flush=True
    )
    uvicorn.run(
        create_app(served), host=args.host, port=args.port, timeout_graceful_shutdown=args.drain_timeout,
        log_level="warning",
    )  # fmt: skip


if __name__ == "__main__":
    run(main)
