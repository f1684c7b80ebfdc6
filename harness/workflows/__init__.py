"""What produces runs: ``grid`` (the config grid, judged by its rules), ``costs`` (every workaround,
priced), ``bisect`` (a repro across a package's releases, or days), ``watch`` (tonight against the
previous night, every change explained) and ``atlas check --prove`` (a stack built and run). Each
runs its items as ``run`` does, through the pipeline's session or item runner; what they write is
read by ``harness/analysis``."""
