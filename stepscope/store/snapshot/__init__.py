"""Memory snapshots (``torch.cuda.memory._dump_snapshot``) as store tables.

``unpickle`` reads a pickle without running anything in it (the one place that unpickles a
snapshot; the collector uses it too), ``reader`` streams a file into columns, ``tables`` makes
the store's four snapshot tables of them and ``ingest`` commits them as one rank of a run.
"""
