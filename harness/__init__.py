"""The orchestrator: matrix, environments, launching, outcomes, results. Never imports torch."""

__version__ = "0.1.0"
