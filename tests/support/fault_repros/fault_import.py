"""FAULT-IMPORT: a repro file that crashes when it is imported (it declares a SPEC it never reaches)."""

raise ImportError("this repro file is broken on purpose")

SPEC = None
