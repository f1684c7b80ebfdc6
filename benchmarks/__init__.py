"""The project's own benchmarks, outside the harness they measure: what the harness costs against
bare torchrun (``items.py``), items per minute by executor (``executors.py``), and the HTML report
at 10,000 items (``report_page.py``). One verb runs them, ``bench`` (``command.py``: one parser for
the three), which the harness's verb table names by path (``harness/cli/commands/__init__.py``), so
no harness module imports this package (import-linter holds it).
"""
