"""``crosscheck``: every training strategy must train what one process trains on the same global batch.

``strategy.py`` names the strategies (standard library: the orchestrator plans them); ``training.py`` trains a
strategy on the item's ranks and the one-process reference; ``tolerance.py`` bounds the difference allowed;
``compare.py`` finds the first that exceeds it; ``after.py`` saves, reloads and merges the adapter;
``check.py`` puts them together; ``item.py`` is what a crosscheck item runs.
"""
