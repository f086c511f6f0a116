"""Replay the run-events topic: verify the live snapshots, or rebuild a processor's stores."""

from processors.replay.rebuild import RebuildError, RebuildReport, rebuild
from processors.replay.verify import Difference, VerifyReport, verify

__all__ = ["Difference", "RebuildError", "RebuildReport", "VerifyReport", "rebuild", "verify"]
