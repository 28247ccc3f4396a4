"""Every private TRL and transformers member our trainers use (`trainers.private_members`) is still there."""

import inspect
import re

import pytest
from transformers import Trainer
from trl import GRPOTrainer, SFTTrainer

from parallel_r1.trainers import ParallelGRPOTrainer, ParallelSFTTrainer
from parallel_r1.trainers.private_members import PRIVATE_MEMBERS

CLASSES = {"GRPOTrainer": GRPOTrainer, "SFTTrainer": SFTTrainer, "Trainer": Trainer}
KINDS = {"overridden", "called", "set in __init__", "class attribute"}


@pytest.mark.parametrize("owner, member, kind, use", PRIVATE_MEMBERS, ids=[f"{o}.{m}" for o, m, *_ in PRIVATE_MEMBERS])
def test_the_private_member_is_where_ours_expects_it(owner, member, kind, use):
    parent = CLASSES[owner]
    assert kind in KINDS and use
    if kind == "set in __init__":
        assigned = re.search(rf"self\.{member}\s*(:[^=\n]*)?=[^=]", inspect.getsource(parent.__init__))
        assert assigned, f"{owner}.__init__ no longer sets self.{member}: {use}"
    else:
        assert hasattr(parent, member), f"{owner}.{member} is gone: {use}"
    if kind in ("overridden", "called"):
        assert callable(getattr(parent, member))


def test_every_override_of_a_private_method_is_listed():
    listed = {member for _, member, kind, _ in PRIVATE_MEMBERS if kind == "overridden"}
    for ours, parent in ((ParallelGRPOTrainer, GRPOTrainer), (ParallelSFTTrainer, SFTTrainer)):
        overrides = {name for name in vars(ours) if name.startswith("_") and not name.startswith("__")}
        private_of_parent = {name for name in overrides if hasattr(parent, name)}
        assert private_of_parent <= listed, private_of_parent - listed
