"""The tag language of parallel thinking: parse, validate, serialize, measure.

A completion is main text with blocks in it. A block is

    <Parallel> [lead] <Path> body </Path> [lead] <Path> body </Path> ... [tail] </Parallel>
    [separator] <Summary> body </Summary>

`parse` reads a completion given as text (spans in characters) or as token ids (spans in
tokens) into a tree of `Text` and `Block` nodes. It never raises and loses nothing:
`serialize(parse(x)) == x` for every input. It follows the same state machine as the fork-join
rollout engine, so the tree of any sampled completion (cut or not) is the structure it was
sampled with: inside a path every token up to `</Path>` belongs to that path, whatever it is.

`Parsed.errors` lists every rule a completion breaks, each with a code, where and why. A
completion is well-formed when the list is empty. The rules are the official tag-stack checker's
(docs/paper.md, the format) plus these, which are stricter:

- `</Summary>` must close every summary (the official check ignores it), because an unclosed
  summary means the rollout was cut and the merge step never finished.
- Only whitespace may stand between `<Parallel>`, the paths and `</Parallel>`, and between
  `</Parallel>` and `<Summary>` (the official check tolerates any text there): text outside a
  path belongs to no path, so the Unseen structure could not say what may see it. Whitespace
  means ASCII whitespace (`BLANK`), in both parsers: a token is blank when its text is, and a
  run of tokens is blank exactly when its text is (a multi-byte space such as U+00A0 is text in
  both, whichever way a tokenizer splits its bytes).
- Any tag inside a path or a summary is an error (a nested block, a path without a block, ...):
  nested blocks are not part of the method and the official check's stack accepts some of them.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from typing import Literal

PARALLEL_OPEN = "<Parallel>"
PARALLEL_CLOSE = "</Parallel>"
PATH_OPEN = "<Path>"
PATH_CLOSE = "</Path>"
SUMMARY_OPEN = "<Summary>"
SUMMARY_CLOSE = "</Summary>"
TAGS = (PARALLEL_OPEN, PARALLEL_CLOSE, PATH_OPEN, PATH_CLOSE, SUMMARY_OPEN, SUMMARY_CLOSE)
MIN_PATHS = 2
DECISION_TAGS = (PATH_OPEN, PARALLEL_CLOSE)  # what the model may write where it chooses a block's width

Content = str | tuple  # text, or a tuple of token ids
ParserState = Literal["main", "block", "path", "after_block", "summary"]  # where a completion is (see `_Parser`)
BLANK = frozenset(" \t\n\r\f\v")
_TAG_SPLIT = re.compile("(" + "|".join(re.escape(t) for t in TAGS) + ")")


def is_blank(text: str) -> bool:
    """Non-empty and ASCII whitespace only."""
    return bool(text) and all(c in BLANK for c in text)


@dataclass(frozen=True)
class TagVocab:
    """The token ids of the tags, and which ids decode to whitespace only (`tokens.tag_vocab` reads them)."""

    ids: dict  # tag -> id
    blank_ids: frozenset = frozenset()

    @cached_property
    def tag_of(self) -> dict:
        return {i: t for t, i in self.ids.items()}


@dataclass(frozen=True)
class FormatError:
    code: str  # machine-readable: unclosed_path, too_few_paths, missing_summary, ...
    at: int  # where (character or token index)
    message: str

    def __str__(self) -> str:
        return f"{self.message} (at {self.at})"


@dataclass
class Text:
    """Main text outside any block."""

    content: Content
    start: int

    @property
    def end(self) -> int:
        return self.start + len(self.content)


@dataclass
class Path:
    """One path: an optional whitespace lead, then `<Path>` body [`</Path>`]."""

    lead: Content
    body: Content
    closed: bool
    start: int  # first unit of the lead
    open_at: int  # where `<Path>` is
    end: int  # one past the last unit (`</Path>` included when present)

    @property
    def length(self) -> int:
        return self.end - self.start


@dataclass
class Block:
    """`<Parallel>` paths [tail] [`</Parallel>` [separator] [`<Summary>` body [`</Summary>`]]]."""

    start: int  # where `<Parallel>` is
    opener_end: int  # one past `<Parallel>`
    end: int  # one past the last unit of the block, its summary included
    paths: list = field(default_factory=list)
    tail: Content = ""
    closed: bool = False
    close_at: int | None = None  # where `</Parallel>` is
    separator: Content = ""
    summary: Content | None = None
    summary_closed: bool = False

    @property
    def paths_end(self) -> int:
        """One past the last path (or past `<Parallel>` if there is none)."""
        return self.paths[-1].end if self.paths else self.opener_end


@dataclass
class Parsed:
    nodes: list  # Text and Block, in order
    errors: list  # FormatError, in order of position
    length: int
    is_ids: bool

    @property
    def blocks(self) -> list:
        return [n for n in self.nodes if isinstance(n, Block)]

    @property
    def well_formed(self) -> bool:
        return not self.errors

    @property
    def has_parallel(self) -> bool:
        """At least one block, and the completion well-formed (the paper's "parallel ratio" event)."""
        return bool(self.blocks) and self.well_formed

    @property
    def reason(self) -> str | None:
        """Why the completion is malformed (the first error), or None if it is well-formed."""
        return str(self.errors[0]) if self.errors else None


# --------------------------------------------------------------------------- parsing


def _units_from_text(text: str):
    """(unit, tag-or-None) pairs: tags are one unit, text between tags is one unit."""
    for piece in _TAG_SPLIT.split(text):
        if piece:
            yield piece, (piece if piece in TAGS else None)


def _units_from_ids(ids, vocab: TagVocab):
    for i in ids:
        yield (i,), vocab.tag_of.get(i)


def parse(completion: str | list | tuple, vocab: TagVocab | None = None) -> Parsed:
    """Parse a completion (text, or token ids with the `vocab` of their tokenizer)."""
    return _run(completion, vocab)


def parser_states(completion_ids, vocab: TagVocab) -> list[ParserState]:
    """The parser's state before each token (see `_Parser`)."""
    trace: list[ParserState] = []
    _run(list(completion_ids), vocab, trace)
    return trace


def decision_points(completion_ids, vocab: TagVocab, widths) -> list[int]:
    """Where the model chooses a block's width: the index of the first token that is not whitespace after the
    `</Path>` of a block's k-th path with `min_paths <= k < max_paths` (read from `widths`, the run's settings
    whole: any object with `min_paths` and `max_paths`, such as `rollout.ParallelArguments` or a `Grammar`). The model writes one of `DECISION_TAGS`
    there: `<Path>` opens path k + 1, `</Parallel>` ends the block. The engine writes no whitespace between the tags,
    so in a rollout it is the token right after `</Path>`; in a trace it may follow a newline. Empty when
    `min_paths == max_paths` (every width is fixed)."""
    min_paths, max_paths = widths.min_paths, widths.max_paths
    if min_paths >= max_paths:
        return []
    closer, opener, points, closed, pending = vocab.ids[PATH_CLOSE], vocab.ids[PARALLEL_OPEN], [], 0, False
    states = parser_states(completion_ids, vocab)
    for i, (token, state) in enumerate(zip(completion_ids, states)):
        if token == opener and state in ("main", "after_block"):  # a new block (after a summary, or none)
            closed, pending = 0, False
        elif state == "path" and token == closer:
            closed += 1
            pending = min_paths <= closed < max_paths
        elif pending and state == "block" and token not in vocab.blank_ids:
            points.append(i)
            pending = False
    return points


def _run(completion, vocab, trace: list[ParserState] | None = None) -> Parsed:
    if isinstance(completion, str):
        return _Parser(is_ids=False, blank=is_blank).run(_units_from_text(completion), trace)
    if vocab is None:
        raise ValueError("parse() needs the TagVocab of the tokenizer to read token ids")
    ids = tuple(int(i) for i in completion)
    blank = lambda unit: all(i in vocab.blank_ids for i in unit)  # noqa: E731
    return _Parser(is_ids=True, blank=blank).run(_units_from_ids(ids, vocab), trace)


class _Parser:
    """The state machine: main -> block -> path -> block -> after_block -> summary -> main."""

    def __init__(self, is_ids: bool, blank):
        self.is_ids = is_ids
        self.blank = blank
        self.nodes: list = []
        self.errors: list = []
        self.pos = 0
        self.state: ParserState = "main"
        self.block: Block | None = None
        self.after_summary = False  # only whitespace since the last closed summary
        self.run_start = 0  # where the current run of non-tag units began
        self.step: dict[ParserState, Callable] = {  # the handler of each state
            "main": self.in_main,
            "block": self.in_block,
            "path": self.in_path,
            "after_block": self.in_after_block,
            "summary": self.in_summary,
        }

    def new(self) -> Content | list:
        """Empty content. An id parse grows lists, one token at a time (a tuple would be copied at each), and
        freezes them into tuples when it finishes."""
        return [] if self.is_ids else ""

    def error(self, code: str, at: int, message: str) -> None:
        """Record a broken rule, once per run of units between two tags (a text parse reads such a run as one
        unit, an id parse as one unit per token: both report it once)."""
        last = self.errors[-1] if self.errors else None
        if last is not None and last.code == code and last.at >= self.run_start:
            return
        self.errors.append(FormatError(code, at, message))

    def run(self, units, trace: list[ParserState] | None = None) -> Parsed:
        for unit, tag in units:
            if trace is not None:
                trace.append(self.state)
            self.step[self.state](unit, tag)
            self.pos += len(unit)
            if tag is not None:
                self.run_start = self.pos
        self.finish()
        return Parsed(self.nodes, self.errors, self.pos, self.is_ids)

    def extend_block(self, unit) -> None:
        """The unit at self.pos belongs to the current block (and to its open path, if any)."""
        self.block.end = self.pos + len(unit)
        if self.state == "path":
            self.block.paths[-1].end = self.block.end

    # -- main text
    def in_main(self, unit, tag) -> None:
        if tag == PARALLEL_OPEN:
            end = self.pos + len(unit)
            self.block = Block(start=self.pos, end=end, opener_end=end, tail=self.new(), separator=self.new())
            self.nodes.append(self.block)
            self.state = "block"
            self.after_summary = False
            return
        if tag == SUMMARY_OPEN and self.after_summary:
            self.error("duplicate_summary", self.pos, "a second <Summary> after a block's summary")
        elif tag == SUMMARY_OPEN:
            self.error("summary_outside_block", self.pos, "<Summary> that does not follow a </Parallel>")
        elif tag == PATH_OPEN:
            self.error("path_outside_block", self.pos, "<Path> outside a <Parallel> block")
        elif tag is not None:
            self.error("stray_closing_tag", self.pos, f"{tag} with nothing open to close")
        if tag is not None or not self.blank(unit):
            self.after_summary = False
        last = self.nodes[-1] if self.nodes else None
        if isinstance(last, Text) and last.end == self.pos:
            last.content += unit
        else:
            self.nodes.append(Text(list(unit) if self.is_ids else unit, self.pos))

    # -- inside <Parallel>, between paths
    def in_block(self, unit, tag) -> None:
        block = self.block
        if tag == PATH_OPEN:
            start = self.pos - len(block.tail)
            block.paths.append(
                Path(lead=block.tail, body=self.new(), closed=False, start=start, open_at=self.pos, end=0)
            )
            block.tail = self.new()
            self.state = "path"
        elif tag == PARALLEL_CLOSE:
            block.closed, block.close_at = True, self.pos
            if len(block.paths) < MIN_PATHS:
                self.error(
                    "too_few_paths",
                    block.start,
                    f"block with {len(block.paths)} path(s); a block needs at least {MIN_PATHS}",
                )
            self.state = "after_block"
        else:
            if tag == PARALLEL_OPEN:
                self.error("nested_block", self.pos, "<Parallel> inside a block")
            elif tag is not None:
                self.error("tag_between_paths", self.pos, f"{tag} between the paths of a block")
            elif not self.blank(unit):
                self.error("text_between_paths", self.pos, "text between the paths of a block, outside any path")
            block.tail += unit
        self.extend_block(unit)

    # -- inside <Path>
    def in_path(self, unit, tag) -> None:
        path = self.block.paths[-1]
        if tag == PATH_CLOSE:
            path.closed = True
        elif tag == PARALLEL_OPEN:
            self.error("nested_block", self.pos, "<Parallel> inside a path (nested blocks are not allowed)")
        elif tag is not None:
            self.error("tag_in_path", self.pos, f"{tag} inside a path")
        if tag != PATH_CLOSE:
            path.body += unit
        self.extend_block(unit)
        if path.closed:
            self.state = "block"

    # -- after </Parallel>, waiting for <Summary>
    def in_after_block(self, unit, tag) -> None:
        if tag == SUMMARY_OPEN:
            self.block.summary = self.new()
            self.state = "summary"
        elif tag is None and self.blank(unit):
            self.block.separator += unit
        else:
            self.error("missing_summary", self.pos, "a block is not followed by a <Summary>")
            self.state = "main"
            self.in_main(unit, tag)
            return
        self.extend_block(unit)

    # -- inside <Summary>
    def in_summary(self, unit, tag) -> None:
        if tag == SUMMARY_CLOSE:
            self.block.summary_closed = True
            self.state = "main"
            self.after_summary = True
        else:
            if tag is not None:
                self.error("tag_in_summary", self.pos, f"{tag} inside a summary")
            self.block.summary += unit
        self.extend_block(unit)

    def finish(self) -> None:
        block = self.block
        if self.state == "path":
            self.error("unclosed_path", block.paths[-1].open_at, "a <Path> is never closed")
        if self.state in ("path", "block"):
            self.error("unclosed_block", block.start, "a <Parallel> block is never closed")
        elif self.state == "after_block":
            self.error("missing_summary", self.pos, "a block is not followed by a <Summary>")
        elif self.state == "summary":
            self.error("unclosed_summary", self.pos, "a <Summary> is never closed")
        self.errors.sort(key=lambda e: e.at)
        if self.is_ids:
            self.freeze()

    def freeze(self) -> None:
        """The id parse's lists as tuples."""
        for node in self.nodes:
            if isinstance(node, Text):
                node.content = tuple(node.content)
                continue
            node.tail, node.separator = tuple(node.tail), tuple(node.separator)
            if node.summary is not None:
                node.summary = tuple(node.summary)
            for path in node.paths:
                path.lead, path.body = tuple(path.lead), tuple(path.body)


# --------------------------------------------------------------------------- serializing


def serialize(parsed: Parsed, vocab: TagVocab | None = None) -> str | tuple:
    """Write the tree back: text for a text parse, a tuple of ids for an id parse."""
    if parsed.is_ids and vocab is None:
        raise ValueError("serialize() needs the TagVocab to write token ids")
    tag = (lambda t: (vocab.ids[t],)) if parsed.is_ids else (lambda t: t)
    pieces = []
    for node in parsed.nodes:
        if isinstance(node, Text):
            pieces.append(node.content)
            continue
        pieces.append(tag(PARALLEL_OPEN))
        for path in node.paths:
            pieces += [path.lead, tag(PATH_OPEN), path.body]
            if path.closed:
                pieces.append(tag(PATH_CLOSE))
        pieces.append(node.tail)
        if node.closed:
            pieces += [tag(PARALLEL_CLOSE), node.separator]
        if node.summary is not None:
            pieces += [tag(SUMMARY_OPEN), node.summary]
            if node.summary_closed:
                pieces.append(tag(SUMMARY_CLOSE))
    if parsed.is_ids:
        return tuple(i for piece in pieces for i in piece)
    return "".join(pieces)


def canonical_block(paths: list[str], summary: str) -> str:
    """The canonical text of one block (docs/paper.md, the format): contiguous tags, `\\n` before the summary."""
    body = "".join(f"{PATH_OPEN}{p}{PATH_CLOSE}" for p in paths)
    return f"{PARALLEL_OPEN}{body}{PARALLEL_CLOSE}\n{SUMMARY_OPEN}{summary}{SUMMARY_CLOSE}"


def strip_tags(text: str) -> str:
    """The text with the six tags removed."""
    return _TAG_SPLIT.sub("", text)


# --------------------------------------------------------------------------- stats


@dataclass(frozen=True)
class Stats:
    """Shape of one completion. Units are tokens for an id parse, characters for a text parse."""

    num_blocks: int
    paths_per_block: tuple
    block_positions: tuple  # where each <Parallel> starts, relative to the completion length (0..1)
    total: int  # T: every unit
    critical: int  # D: what is decoded one unit after another (see `stats`)
    well_formed: bool
    has_parallel: bool  # see Parsed.has_parallel
    alike_blocks: int = 0  # blocks where two paths open alike (`opens_alike`)


OPENING = 3  # units of a path's body that `opens_alike` compares


def opens_alike(block: Block) -> bool:
    """Whether two of the block's paths open with the same first `OPENING` units of their bodies (the whole body when
    shorter): a cheap sign that the paths collapsed into one way of working."""
    openings = [tuple(path.body[:OPENING]) for path in block.paths if len(path.body)]
    return len(set(openings)) < len(openings)


def stats(parsed: Parsed, concurrent: int | None = None) -> Stats:
    """The shape of a completion. D (`critical`) is the critical path of a fork-join decode: every unit but those of
    the paths decoded alongside a longer one. The first `concurrent` paths of a block (all of them when None) are
    decoded at once, so only the longest of them counts; a path after them is decoded alone, once the model chose
    to open it, and counts in full."""
    blocks = parsed.blocks
    saved = sum(
        sum(p.length for p in b.paths[:concurrent]) - max(p.length for p in b.paths[:concurrent])
        for b in blocks
        if b.paths
    )
    n = max(parsed.length, 1)
    return Stats(
        num_blocks=len(blocks),
        paths_per_block=tuple(len(b.paths) for b in blocks),
        block_positions=tuple(b.start / n for b in blocks),
        total=parsed.length,
        critical=parsed.length - saved,
        well_formed=parsed.well_formed,
        has_parallel=parsed.has_parallel,
        alike_blocks=sum(opens_alike(b) for b in blocks),
    )
