"""Reliability drills: long adversarial runs over the library, too big for the test suite (tests run them small)."""
