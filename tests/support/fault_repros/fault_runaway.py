"""FAULT-RUNAWAY: a user's script whose declared signature pattern backtracks without end on the
message it raises: bounded in the rank and in the orchestrator, and named as a runaway pattern."""

REPRO = {
    "id": "FAULT-RUNAWAY",
    "fails_with": {"type": "ValueError", "pattern": r"(?:(a|aa)+)+b\1"},
}

if __name__ == "__main__":
    raise ValueError("a" * 40)
