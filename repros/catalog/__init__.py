"""The catalog: one module per documented failure (``SPEC`` and ``run(ctx)``), found by discovery."""
