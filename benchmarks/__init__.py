"""The project's own benchmarks, outside the harness they measure: what the harness costs against
bare torchrun (``items.py``), items per minute by executor (``executors.py``), and the HTML report
at 10,000 items (``report_page.py``). One verb runs them, ``bench`` (``command.py``), which the
project plugs into the command line the way any installed package adds a verb: an entry point in
the ``ft_regress.commands`` group (``pyproject.toml``). The harness never imports this package
(import-linter holds it).
"""
