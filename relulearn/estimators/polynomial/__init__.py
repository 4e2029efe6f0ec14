"""Method ``polynomial``: the Hermite expansion truncated at degree L; its whole code is :mod:`.entry`."""

from .entry import MAX_PASSES, check_setting, learn, required_statistics

__all__ = ["MAX_PASSES", "check_setting", "learn", "required_statistics"]
