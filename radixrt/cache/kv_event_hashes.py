"""The observer that turns a cache's node changes into KV events (`base.CacheEventSink`).

It keeps the chained block hash of every page, per node: a new leaf reports its pages as stored
(chained on its parent's last page), an evicted node reports them removed, a reset reports
everything cleared; a split moves hashes between the two halves and reports nothing (the same
pages stay resident).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from radixrt.cache.base import CacheEventSink, ObservedNode


class KVEventHashes:
    """A `CacheObserver` reporting to `sink`; attach it while the cache is empty (a node it has
    not seen inserted has no hashes to chain on or to report removed)."""

    def __init__(self, sink: CacheEventSink, page_size: int) -> None:
        self.sink = sink
        self.page_size = page_size
        self._hashes: dict[int, list[int]] = {}  # node id -> block hash of each of its pages

    def inserted(self, node: ObservedNode) -> None:
        parent = node.parent
        above = self._hashes.get(parent.id) if parent is not None else None  # root: none
        self._hashes[node.id] = self.sink.stored(above[-1] if above else None, node.key)

    def split(self, upper: ObservedNode, lower: ObservedNode) -> None:
        hashes, cut = self._hashes.pop(lower.id, []), len(upper.key) // self.page_size
        self._hashes[upper.id], self._hashes[lower.id] = hashes[:cut], hashes[cut:]

    def locked(self, nodes: Sequence[ObservedNode]) -> None:
        """Locks change no resident page."""

    def released(self, nodes: Sequence[ObservedNode]) -> None:
        """Unlocks change no resident page."""

    def evicted(self, nodes: Sequence[ObservedNode]) -> None:
        for node in nodes:
            self.sink.removed(self._hashes.pop(node.id, []))

    def cleared(self, nodes: Sequence[ObservedNode]) -> None:
        self._hashes.clear()
        self.sink.cleared()
