"""Putting lane micro-batches from several producers back into the rank's order.

Host loaders run the pipeline in worker processes, each over some of the rank's lanes. Their items
arrive interleaved by the host (torch's DataLoader takes one from each worker in turn), and after a
mid-step checkpoint restored with another worker count, workers start at different points. The rank's
order is (step, micro-batch index, lane): a group is released once every lane that still owes an item
to the earliest open (step, micro) has delivered it.
"""
from __future__ import annotations


class StepAssembly:
    """Reorder a rank's lane items into (step, micro-batch, lane) order.

    Args:
        lanes: the rank's lanes, in the order a group lists them.
        cursors: the rank's ``LaneCursor``s at the start (``Progress.cursors()``); they say which (step, micro)
            each lane delivers next.
        rows_per_lane_step, micro_batch_size: the loader's (rows per lane per step; rows per micro-batch).
    ``add(step, micro, lane, item, last=True)`` files one item (several items may make up one lane's part
    of a group: ``last`` marks its final one) and returns the groups now complete, each a list of items
    in lane order; ``finish()`` returns what is left at the end of the stream (groups some lane never
    completed, e.g. a finite stream's end), in order."""

    def __init__(self, lanes, cursors, rows_per_lane_step: int, micro_batch_size: int):
        self.lanes = list(lanes)
        self.next_pos = {c.lane: c.position(rows_per_lane_step, micro_batch_size) for c in cursors}
        self.open: dict[tuple, list] = {}
        self.done: dict[tuple, dict] = {}
        self.streamed: dict[tuple, int] = {}  # (step, micro) -> lanes (in order) whose items ``stream`` released

    def add(self, step: int, micro: int, lane: int, item, last: bool = True) -> list[list]:
        self._file(step, micro, lane, item, last)
        return self._release(final=False)

    def _file(self, step: int, micro: int, lane: int, item, last: bool) -> None:
        key = (step, micro)
        self.open.setdefault((key, lane), []).append(item)
        if last:
            self.done.setdefault(key, {})[lane] = self.open.pop((key, lane))
            # This lane's next item is later than (step, micro); (step, rows/m) sorts before (step + 1, 0).
            self.next_pos[lane] = (step, micro + 1)

    def finish(self) -> list[list]:
        return self._release(final=True)

    def stream(self, step: int, micro: int, lane: int, item, last: bool = True) -> list:
        """``add``, but returns the single items now in order (a lane's part of a group as soon as every lane
        before it in the group has delivered; an endless stream's first item need not wait for the whole group).
        Use either ``add``/``finish`` or ``stream`` on one assembly."""
        self._file(step, micro, lane, item, last)
        out = []
        while self.done:
            key = min(self.done)
            got, k = self.done[key], self.streamed.get(key, 0)
            while k < len(self.lanes):
                lane_k = self.lanes[k]
                if lane_k in got:
                    out += got.pop(lane_k)
                elif self.next_pos[lane_k] <= key:  # this lane still owes the group an item: wait for it
                    break
                k += 1
            self.streamed[key] = k
            if k < len(self.lanes):
                break
            del self.done[key], self.streamed[key]
        return out

    def _release(self, final: bool) -> list[list]:
        out = []
        while self.done:
            key = min(self.done)
            got = self.done[key]
            if not final and any(lane not in got and self.next_pos[lane] <= key for lane in self.lanes):
                break
            del self.done[key]
            out.append([item for lane in self.lanes for item in got.get(lane, ())])
        return out
