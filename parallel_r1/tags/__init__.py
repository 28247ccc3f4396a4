"""The tag language, in three modules:

- `language`: the six tags, parsing text or token ids into blocks, paths and summaries (with a reason for each
  broken rule), serializing back, and the stats (blocks, paths, the critical path D, the total T);
- `grammar`: which tag may be sampled next, the rule the sampler and the training forward share;
- `tokens`: the tags as single tokens of a tokenizer (adding them, finding their ids).
"""
