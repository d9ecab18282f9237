"""The call tree of a function_graph trace: per thread, every distinct stack of calls as a node
with its calls, total time and self time. Flame graphs, icicles and folded stacks are drawings
of it.

Built from the slices of :func:`rethook.output.slices.slice_events` (with ``close_open``):
a node is one stack, root first; ``calls`` counts the slices of that stack, so a generator or
coroutine resumed three times under the same stack is three calls there, and counts only while
it runs, under whatever resumed it (time suspended is nobody's). A call still running when the
trace ends counts up to its thread's last event.

API::

    tree = build_call_tree(slice_events(reader, close_open=True), reader.threads)
    for tid, root in tree.roots.items():      # root: a Node named after the thread
        for node, stack in root.walk():       # depth first; stack: names from the root down
            node.calls, node.total_ns, node.self_ns
    tree.merged()                             # one root: every thread's stacks merged
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from rethook.output.slices import SLICE_BEGIN, SLICE_END, Record


@dataclass(slots=True)
class Node:
    """One stack of calls: its last frame's name, and the time spent in it."""

    name: str
    calls: int = 0
    total_ns: int = 0  # time from the slices' begins to their ends
    self_ns: int = 0  # total minus the children's
    children: dict[str, Node] = field(default_factory=dict)

    def child(self, name: str) -> Node:
        node = self.children.get(name)
        if node is None:
            node = self.children[name] = Node(name)
        return node

    def walk(self, stack: tuple[str, ...] = ()) -> Iterator[tuple[Node, tuple[str, ...]]]:
        """Every node under this one (not this one), depth first, children in name order,
        with its stack of names (this node's children first)."""
        todo = [(self, stack)]
        while todo:
            node, above = todo.pop()
            for name in sorted(node.children, reverse=True):
                child = node.children[name]
                here = (*above, name)
                todo.append((child, here))
            if node is not self:
                yield node, above

    def merge(self, other: Node) -> None:
        """Add ``other``'s calls and times, and its children's, into this node."""
        self.calls += other.calls
        self.total_ns += other.total_ns
        self.self_ns += other.self_ns
        for name, child in other.children.items():
            self.child(name).merge(child)


@dataclass
class CallTree:
    """Per thread, a root node (named after the thread, no calls of its own) whose children
    are the thread's outermost calls."""

    roots: dict[int, Node] = field(default_factory=dict)

    def merged(self, name: str = "all threads") -> Node:
        root = Node(name)
        for tree in self.roots.values():
            for child in tree.children.values():
                root.child(child.name).merge(child)
        return root


def build_call_tree(records: Iterable[Record], thread_names: dict[int, str] | None = None
                    ) -> CallTree:
    """The call tree of slice records in which every slice ends (``close_open=True``)."""
    names = thread_names or {}
    tree = CallTree()
    # per thread: the open slices as [node, begin, time in children]
    open_: dict[int, list[list]] = {}
    for kind, ts, tid, name, _ in records:
        if kind == SLICE_BEGIN:
            frames = open_.get(tid)
            if frames is None:
                frames = open_[tid] = []
            if frames:
                parent = frames[-1][0]
            else:
                parent = tree.roots.get(tid)
                if parent is None:
                    parent = tree.roots[tid] = Node(names.get(tid, f"tid-{tid}"))
            frames.append([parent.child(name), ts, 0])
        elif kind == SLICE_END:
            frames = open_[tid]
            node, begin, children = frames.pop()
            spent = ts - begin
            node.calls += 1
            node.total_ns += spent
            node.self_ns += spent - children
            if frames:
                frames[-1][2] += spent
    return tree
