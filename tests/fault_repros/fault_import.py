"""FAULT-IMPORT: a repro file that crashes when it is imported."""

raise ImportError("this repro file is broken on purpose")
