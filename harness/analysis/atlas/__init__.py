"""The compatibility atlas: which documented failures a stack has, from what was proven, and by which run.

- ``model.py``: ``atlas.json`` as typed values (claims, boundaries, evidence), written whole, read back validated;
- ``stacks.py``: a stack against a claim (is it inside what was proven?);
- ``expectations.py``: the claims a repro's expectations make (their ``when`` ranges, under the stacks they were
  established on, for the packages the failure depends on);
- ``evidence.py``: the claims runs make (``--from``: a run's records, a bisect, a watch night, an atlas);
- ``derive.py``: contradictions, and the boundaries each failure's claims draw;
- ``build.py``: ``atlas build``; ``check.py``: ``atlas check``; ``prove.py``: ``atlas check --prove``;
- ``issues.py``: one issue text per culprit the nightly's watch named; ``html.py``: the page.
"""
