"""How ``next()`` gets its micro-batch: built inside it, or taken from the builder thread.

Either way the time inside ``next()`` is counted as the consumer's wait (``MetricsCounter.add_wait``) and the
micro-batch is delivered (``Tail.deliver``) before ``next()`` returns it: what a checkpoint counts is what the
loop has. The ``Loader`` chooses: the inline runner and shared lanes build inside ``next()`` (``computed``), the
``threads`` and ``processes`` runners take what their ``engine.builder.Builder`` built (``taken``).
"""
from __future__ import annotations

from time import perf_counter


def computed(items, lock, deliver, add_wait, poke):
    """``items``' micro-batches, each computed and delivered inside ``next()`` holding the loader's lock.

    items: the ``(micro-batch, Handed)`` generator (``Tail.steps``, maybe filtered by ``sharing``). lock: the
    Loader's lock. deliver: ``Tail.deliver``. add_wait: called with the seconds spent inside ``next()``. poke: the
    dispatcher's ``poke`` (rows were taken), or None without a dispatcher."""
    while True:
        t = perf_counter()  # the consumer asked for a micro-batch at t
        with lock:
            item = next(items, None)
            if item is None:
                return
            deliver(*item)
        add_wait(perf_counter() - t)
        if poke is not None:
            poke()  # rows were taken: the lane may work further ahead
        yield item[0]


def taken(builder, deliver, add_wait, check):
    """The micro-batches ``builder`` built ahead, each delivered as ``next()`` takes it.

    builder: the iteration's ``Builder``. deliver, add_wait: as ``computed``'s. check: called before each delivery;
    raises when a ``restore()`` or ``close()`` ended the iteration meanwhile (what was built then is not
    delivered)."""
    while True:
        t = perf_counter()
        item = builder.take()
        if item is None:
            return
        check()
        add_wait(perf_counter() - t)
        deliver(*item)  # its last step is one store: the consumer has the micro-batch once it is done
        yield item[0]
