"""Stage 1: supervised fine-tuning on cold-start traces, in the Seen or the Unseen variant.

- `attention="causal"` (Seen): stock `SFTTrainer`; a later path sees the earlier ones.
- `attention="isolated"` (Unseen): the model is called with the position ids and boolean 4-D attention
  mask of `structure.isolated_inputs`, recomputed for every batch from its own token ids (no side
  channel). Paths of a block cannot see each other; whatever follows a block sees all its paths.
- `attention="tree"`: the policy a serving engine samples in fork mode (`structure.TreeForward`): paths as
  isolated, what follows them reading them as written; the cold start then trains the policy RL samples.

Rules shared by both variants:
- The loss is on the completion only (TRL's completion-only loss: tags and end-of-turn included).
- The six tags are single tokens of the tokenizer before TRL tokenizes anything: missing ones are
  added (`tokens.add_parallel_tokens`, also under ZeRO-3, see `ensure_parallel_tokens`).
- With a PEFT config the tag rows of the embedding (and of an untied LM head) train as well, through
  peft's `trainable_token_indices`: their starting values were made, not learned.
- `tag_lr_multiplier` gives the tag rows their own learning rate (`tag_rate.TagRateMixin`).
- `summary_loss_weight` and `disagreeing_paths_in_loss` teach the summary to vote (`summary_loss`): the first on
  the fused head's log-probs, the second in the data collator, so that TRL counts the tokens the loss has.
"""

from __future__ import annotations

import dataclasses

from peft.utils import TrainableTokensWrapper
from transformers import PreTrainedModel, PreTrainedTokenizerBase
from transformers.integrations import is_deepspeed_zero3_enabled
from trl import SFTTrainer

from ..configs import ParallelSFTConfig
from ..policy import ParallelPolicy
from ..structure import check_attention_implementation
from ..tags.tokens import add_parallel_tokens, missing_tags
from .card import ModelCardMixin
from .summary_loss import DisagreeingPathsOutOfLoss, WeightedSummaries, completion_starts, summary_tokens
from .tag_rate import TagRateMixin


def ensure_parallel_tokens(tokenizer, model, init: str = "spelling") -> list[str]:
    """Add the missing tags to `tokenizer` and rows for them to `model`, started by the rule `init` names
    (`tokens.TagRowArguments`); returns the tags added.

    Under DeepSpeed ZeRO-3 the model is already partitioned when it is loaded, so the embedding
    matrices are gathered for the edit and rank 0's values are scattered back, as transformers' own
    resize does. Only tags that fit the embedding's spare rows can be added that way (Qwen3 bases have
    spare rows); needing a resize under ZeRO-3 is refused: make a "-Special" base first.
    """
    missing = missing_tags(tokenizer)
    if not missing or not is_deepspeed_zero3_enabled():
        return add_parallel_tokens(tokenizer, model, init)
    rows = model.get_input_embeddings().num_embeddings
    if len(tokenizer) + len(missing) > rows:
        raise ValueError(
            f"The tokenizer lacks {missing} and its {len(tokenizer)} entries leave no room for them in the "
            f"{rows}-row embedding: that needs a resize, which is not supported once ZeRO-3 has partitioned the "
            "model. Make a base with the tags first (python scripts/add_special_tokens.py --model_name_or_path "
            "<base> --output_dir <base>-Special) and train from it."
        )
    import deepspeed

    weights = {
        id(m.weight): m.weight for m in (model.get_input_embeddings(), model.get_output_embeddings()) if m is not None
    }
    with deepspeed.zero.GatheredParameters(list(weights.values()), modifier_rank=0):
        return add_parallel_tokens(tokenizer, model, init)


def with_trainable_tag_rows(peft_config, model: PreTrainedModel, tag_ids: list[int]):
    """A copy of `peft_config` whose `trainable_token_indices` also cover the tag rows.

    The input embedding always; the LM head too when it is a separate matrix (a tied head follows the
    embedding in peft).
    """
    names = {module: name for name, module in model.named_modules()}
    layers = [model.get_input_embeddings()]
    head = model.get_output_embeddings()
    if head is not None and head.weight is not layers[0].weight:
        layers.append(head)
    indices = peft_config.trainable_token_indices
    if indices is None:
        indices = {}
    elif not isinstance(indices, dict):  # a plain list means the input embedding
        indices = {names[layers[0]]: list(indices)}
    indices = {key: list(value) for key, value in indices.items()}
    for layer in layers:
        key = next((k for k in indices if names[layer] == k or names[layer].endswith("." + k)), names[layer])
        indices[key] = sorted(set(indices.get(key, [])) | set(tag_ids))
    return dataclasses.replace(peft_config, trainable_token_indices=indices)


def _expose_head_bias(head) -> None:
    """Let SFTTrainer's fused LM head read `bias` through peft's trainable-token wrapper of the LM head.

    The fused head reads `lm_head.weight` and `lm_head.bias`; peft's `TrainableTokensWrapper` (on the
    head when it is tied to the embedding or has tag rows of its own) forwards `weight`, with the
    trained rows merged in, but not `bias`. A plain reference to the wrapped layer's bias fills the gap
    without registering it twice.
    """
    if isinstance(head, TrainableTokensWrapper) and "bias" not in vars(head):
        object.__setattr__(head, "bias", head.original_module.bias)


class ParallelSFTTrainer(ModelCardMixin, TagRateMixin, SFTTrainer):
    """`SFTTrainer` for parallel-thinking traces: Seen (`attention="causal"`) or Unseen (`"isolated"`).

    `model` and `processing_class` are instances, so the tags can be added to both before TRL
    tokenizes the data or wraps the model with PEFT.
    """

    def __init__(
        self,
        model: PreTrainedModel,
        args: ParallelSFTConfig | None = None,
        *,
        processing_class: PreTrainedTokenizerBase,
        peft_config=None,
        **kwargs,
    ):
        args = args if args is not None else ParallelSFTConfig()
        if not isinstance(args, ParallelSFTConfig):
            raise TypeError(f"args must be a ParallelSFTConfig, got {type(args).__name__}")
        if not isinstance(model, PreTrainedModel) or not isinstance(processing_class, PreTrainedTokenizerBase):
            raise TypeError(
                "ParallelSFTTrainer takes a loaded model and tokenizer (AutoModelForCausalLM / AutoTokenizer), got "
                f"{type(model).__name__} and {type(processing_class).__name__}"
            )
        if args.attention != "causal":
            check_attention_implementation(model)
        ensure_parallel_tokens(processing_class, model, args.tag_init)
        self.policy = ParallelPolicy(processing_class, args)  # the structure trained (SFT samples nothing)
        if peft_config is not None:
            peft_config = with_trainable_tag_rows(peft_config, model, sorted(self.policy.vocab.ids.values()))
        if args.summary_loss_weight != 1 and kwargs.get("compute_loss_func") is not None:
            raise ValueError(
                "summary_loss_weight weighs TRL's own loss, and a compute_loss_func replaces that loss: give one or the "
                "other"
            )
        super().__init__(model, args, processing_class=processing_class, peft_config=peft_config, **kwargs)
        if peft_config is not None:
            _expose_head_bias(self.model.get_output_embeddings())
        if not args.disagreeing_paths_in_loss:
            self.data_collator = DisagreeingPathsOutOfLoss(
                self.data_collator, self.policy.vocab, processing_class.decode
            )
        if args.structured_setting is not None:
            self._check_structured_setup(args.structured_setting)

    def _check_structured_setup(self, setting: str) -> None:
        """What reads a row's structure (`setting`) needs its completion whole and in one place."""
        if not (self.completion_only_loss or self.args.assistant_only_loss):
            raise ValueError(
                f"{setting} needs the prompt out of the loss: use prompt-completion data (the default "
                "completion_only_loss then applies) or set completion_only_loss=True"
            )
        parallelism = self.accelerator.parallelism_config
        if parallelism is not None and (parallelism.cp_enabled or parallelism.sp_enabled):
            raise ValueError(
                f"{setting} cannot run with context or sequence parallelism: both shard the sequence, and the "
                "structure is read from whole rows"
            )

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        """Isolated and tree: SFTTrainer's loss, with the model called on the batch's structure (and its summary
        tokens weighted, `summary_loss_weight`).

        Only the model call changes. `inputs` keeps its 2-D attention mask because SFTTrainer also reads
        it after the forward (the token count it logs), and a 4-D mask there would count pairs.
        """
        starts = completion_starts(inputs["labels"])
        model = self.policy.training_forward(model, starts)
        if self.args.summary_loss_weight != 1:
            in_summary = summary_tokens(inputs["input_ids"], starts, self.policy.vocab)
            model = WeightedSummaries(model, in_summary, self.args.summary_loss_weight)
        return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
