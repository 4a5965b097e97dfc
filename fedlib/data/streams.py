"""Class-incremental streams: a labelled dataset cut into T tasks of *disjoint* classes (class order drawn
from a seed, as in the STSA code: ``np.random.seed(seed); permutation``). Labels are re-indexed by their
position in the class order, so the classes of task t are the contiguous block ``[offset_t, offset_t + c_t)``
and a model's first ``num_seen(t)`` outputs are exactly the classes seen after stage t. At every stage the
task's training data is split over K clients by a Dirichlet(beta) label-skew partition *redrawn for every
task* (beta = None: IID). The protocol that runs learners on a stream is :mod:`fedlib.federated.incremental`.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fedlib.core.seeds import derive_seed
from fedlib.data.partition import make_partition


@dataclass(frozen=True)
class Task:
    """One stage: its classes (original label ids, in class order), their position block
    ``[offset, offset + len(classes))``, and indices into the train / test arrays."""

    index: int
    classes: np.ndarray
    offset: int
    train_idx: np.ndarray
    test_idx: np.ndarray

    @property
    def num_classes(self) -> int:
        return len(self.classes)


@dataclass(frozen=True)
class ClassIncrementalStream:
    """T tasks of disjoint classes over one dataset's labels.

    ``class_order``: (C,) original labels in the order they arrive; ``position[label]`` is the
    re-indexed label (0..C-1) used by every learner.
    """

    class_order: np.ndarray
    tasks: tuple[Task, ...]

    @property
    def num_tasks(self) -> int:
        return len(self.tasks)

    @property
    def num_classes(self) -> int:
        return len(self.class_order)

    @property
    def position(self) -> np.ndarray:
        pos = np.full(int(self.class_order.max()) + 1, -1, dtype=np.int64)
        pos[self.class_order] = np.arange(len(self.class_order))
        return pos

    def relabel(self, labels) -> np.ndarray:
        """Original labels (N,) -> positions in the class order (N,)."""
        return self.position[np.asarray(labels, dtype=np.int64)]

    def num_seen(self, t: int) -> int:
        """Number of classes seen after stage t (0-based)."""
        task = self.tasks[t]
        return task.offset + task.num_classes

    def client_partitions(self, t: int, y_train, num_clients: int, beta: float | None,
                          seed: int = 0, min_size: int = 1) -> list[np.ndarray]:
        """Split task t's training indices over K clients (indices into the full train arrays).

        Dirichlet(beta) label skew (NIID-Bench recipe, every client >= ``min_size`` samples as in
        the STSA code) with the seed ``derive_seed(seed, "partition", t)``, so the partition is
        redrawn each task;
        ``beta=None`` gives an IID split.
        """
        idx = self.tasks[t].train_idx
        labels = np.asarray(y_train)[idx]
        if num_clients > len(idx):
            raise ValueError(f"num_clients={num_clients} exceeds the {len(idx)} training samples of task {t}")
        task_seed = derive_seed(seed, "partition", t)
        if beta is None:
            parts = make_partition(labels, num_clients, "iid", seed=task_seed)
        else:
            parts = make_partition(labels, num_clients, "dirichlet", alpha=beta, seed=task_seed, min_size=min_size)
        return [idx[p] for p in parts]


def make_stream(y_train, y_test, num_tasks: int, seed: int = 0, first_task_classes: int | None = None,
                shuffle: bool = True) -> ClassIncrementalStream:
    """Cut the classes of ``y_train`` into ``num_tasks`` disjoint tasks.

    Class order: ``np.random.RandomState(seed).permutation(C)`` (``shuffle=False``: 0..C-1).
    Equal tasks need ``num_tasks`` to divide C. ``first_task_classes`` = b gives the large-first-task
    variant (STSA Table 4): a base task of b classes, then ``num_tasks - 1`` equal tasks over the
    remaining C - b classes (which ``num_tasks - 1`` must divide).
    """
    y_train = np.asarray(y_train, dtype=np.int64)
    y_test = np.asarray(y_test, dtype=np.int64)
    labels = np.unique(y_train)
    if not np.array_equal(labels, np.arange(len(labels))):
        raise ValueError(f"y_train must use the labels 0..C-1, got {labels.tolist()[:20]}")
    missing = np.setdiff1d(np.unique(y_test), labels)
    if missing.size:
        raise ValueError(f"y_test has labels absent from y_train: {missing.tolist()[:20]}")
    c = len(labels)
    if isinstance(num_tasks, bool) or not isinstance(num_tasks, (int, np.integer)) or not 1 <= num_tasks <= c:
        raise ValueError(f"num_tasks must be an integer in [1, {c}] (the number of classes), got {num_tasks!r}")
    if first_task_classes is None:
        if c % num_tasks:
            raise ValueError(f"num_tasks={num_tasks} must divide the {c} classes for equal tasks; use a "
                             f"divisor of {c} or set first_task_classes")
        sizes = [c // num_tasks] * num_tasks
    else:
        b, rest = int(first_task_classes), num_tasks - 1
        if not 1 <= b < c or rest < 1 or (c - b) % rest:
            raise ValueError(f"first_task_classes={first_task_classes} with num_tasks={num_tasks}: need "
                             f"1 <= first_task_classes < {c} and num_tasks-1 dividing the remaining classes")
        sizes = [b] + [(c - b) // rest] * rest
    order = np.random.RandomState(seed).permutation(c) if shuffle else np.arange(c)
    tasks, offset = [], 0
    for t, size in enumerate(sizes):
        cls = order[offset:offset + size]
        tasks.append(Task(t, cls, offset, np.flatnonzero(np.isin(y_train, cls)), np.flatnonzero(np.isin(y_test, cls))))
        offset += size
    return ClassIncrementalStream(order, tuple(tasks))
