"""The command line on top of every stage: one module per verb (``commands/``), the options the
verbs and the pytest plugin share (``options.py``), and the parser and ``main`` (``main.py``)."""
