"""``TaskEncoder.batch_group_criterion`` as the key function of Zephon's ``GroupBatch`` (per-lane buckets).

Energon's ``GroupBatchDataset`` rule: with a fixed ``batch_size`` the criterion returns ``(key, None)``;
without one it returns ``(key, size)``. The criterion runs on the pump, in the lane's order, under the
element's Energon worker context, so the same sample gets the same group whatever the topology.
"""
from __future__ import annotations

from zephon.ops import RecordError

from ._hooks import call_hook, element_index, energon_context, fn_name


class GroupCriterion:
    """``record -> (group key, batch size)`` from the task encoder's ``batch_group_criterion`` on
    ``record["sample"]``; ``None`` (the sample is dropped) when the hook raised ``SkipSample`` or an error
    Energon's ``global_error_handler`` swallowed.

    task_encoder: the TaskEncoder. batch_size: ``get_train_dataset``'s (None: the criterion gives it).
    seed_offset: WorkerConfig.seed_offset. error_handler: the global error handler or None.
    Raises ``RecordError`` (naming the sample) when the criterion breaks Energon's size rule."""

    def __init__(self, task_encoder, batch_size, *, seed_offset: int, error_handler=None):
        self.te, self.batch_size = task_encoder, batch_size
        self.seed_offset, self.error_handler = seed_offset, error_handler
        self.name = fn_name(task_encoder.batch_group_criterion)

    def __call__(self, record: dict):
        with energon_context(self.seed_offset, element_index(record)):
            got = call_hook(self.te.batch_group_criterion, record["sample"], record, self.error_handler,
                            "batch_group_criterion")
        if got is None:
            return None
        key, size = got
        if (size is None) == (self.batch_size is None):
            raise RecordError(f"batch_group_criterion gave group {key!r} batch size {size!r} with "
                              f"batch_size={self.batch_size!r}: exactly one of the two must be None (as Energon "
                              f"asserts)", record)
        return key, self.batch_size if size is None else size
