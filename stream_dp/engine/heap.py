"""Keep an engine's start-up objects out of the cyclic garbage collector's full passes.

A full collection (CPython's generation 2) visits every container object of the process. After
an engine's start-up that is mostly what never goes away: the imported modules, numba's compiled
kernels and llvmlite's objects, SciPy, the Kafka clients. On the benchmark machine a full pass
took 70–100 ms, twice in a 60,000-record run of ``benchmarks/kafka_e2e.py``: a pause in the loop
each time, and ~10 % of the run (``docs/performance.md``, *Polls learned as batches*).
:func:`freeze_start_up` moves the objects that exist once start-up is done to the permanent
generation (:func:`gc.freeze`), so that later passes visit only what the run itself creates.

Reference counting still frees a frozen object as soon as nothing refers to it; only a reference
cycle among frozen objects that becomes garbage later stays in memory. Once per process: a
process that runs engine after engine (a test session, a notebook) freezes what it held at the
first, and the cyclic garbage of the later ones stays collectable.
"""

from __future__ import annotations

import gc

__all__ = ["freeze_start_up"]


def freeze_start_up() -> bool:
    """Freeze the objects the process holds now, the first time it is called in the process;
    whether this call froze them.

    Examples
    --------
    >>> first = freeze_start_up()
    >>> freeze_start_up()  # the second time: nothing more
    False
    """
    if gc.get_freeze_count():
        return False
    gc.freeze()
    return True
