"""fedlib :class:`~fedlib.core.messages.Message` <-> Flower ``RecordDict`` (lossless).

A payload is a tree of dicts, lists, tuples, tensors, numpy arrays and scalars. Every tensor or
array becomes one ``Array`` of the ``ArrayRecord`` "payload" (numpy's ``.npy`` bytes, so float64
survives bit for bit); the tree itself, with scalars inline, is a JSON string in the
``ConfigRecord`` "fedlib". :func:`array_bytes` is what Flower measures for the arrays it sends
(``ArrayRecord.count_bytes``: array data incl. the ``.npy`` headers, plus key names).
"""
from __future__ import annotations

import json
from typing import Any

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, RecordDict

from fedlib.core.messages import Message

PAYLOAD, META = "payload", "fedlib"


def _encode(value: Any, arrays: dict[str, Array]) -> Any:
    if isinstance(value, torch.Tensor):
        arrays[str(len(arrays))] = Array(value.detach().cpu().numpy())
        return {"torch": len(arrays) - 1}
    if isinstance(value, np.ndarray):
        arrays[str(len(arrays))] = Array(np.ascontiguousarray(value))
        return {"numpy": len(arrays) - 1}
    if isinstance(value, np.generic):
        return {"scalar": value.item(), "dtype": value.dtype.str}
    if value is None or isinstance(value, (bool, int, float, str)):
        return {"v": value}
    if isinstance(value, dict):
        return {"dict": [[_encode(k, arrays), _encode(v, arrays)] for k, v in value.items()]}
    if isinstance(value, (list, tuple)):
        return {type(value).__name__: [_encode(v, arrays) for v in value]}
    raise TypeError(f"cannot send a payload entry of type {type(value).__name__} through Flower")


def _decode(node: Any, arrays: ArrayRecord) -> Any:
    (kind, body), = ((k, v) for k, v in node.items() if k != "dtype")
    if kind == "torch":
        return torch.from_numpy(arrays[str(body)].numpy().copy())
    if kind == "numpy":
        return arrays[str(body)].numpy().copy()
    if kind == "scalar":
        return np.dtype(node["dtype"]).type(body)
    if kind == "v":
        return body
    if kind == "dict":
        return {_decode(k, arrays): _decode(v, arrays) for k, v in body}
    if kind in ("list", "tuple"):
        items = [_decode(v, arrays) for v in body]
        return items if kind == "list" else tuple(items)
    raise ValueError(f"malformed fedlib record: unknown node kind {kind!r}")


def to_records(message: Message, **config: Any) -> RecordDict:
    """``message`` as a RecordDict; ``config`` (Flower config scalars) rides in the "fedlib" record."""
    arrays, tree = encode_tree(message.payload)
    meta = ConfigRecord({"tree": tree, "sender": message.sender, **config})
    return RecordDict({PAYLOAD: arrays, META: meta})


def from_records(content: RecordDict) -> Message:
    """The fedlib :class:`Message` held by ``content`` (made by :func:`to_records`); ValueError for a
    record that is not one."""
    if PAYLOAD not in content.array_records or META not in content.config_records:
        raise ValueError(f"not a fedlib message: expected records {PAYLOAD!r} and {META!r}, "
                         f"got {sorted(content.keys())}")
    meta = content.config_records[META]
    if "tree" not in meta or "sender" not in meta:
        raise ValueError("malformed fedlib message: its 'fedlib' record lacks the tree or the sender")
    payload = decode_tree(content.array_records[PAYLOAD], meta["tree"])
    if not isinstance(payload, dict):
        raise ValueError("malformed fedlib message: the payload is not a dict")
    return Message(str(meta["sender"]), payload)


def encode_tree(value: Any) -> tuple[ArrayRecord, str]:
    """A tree of dicts, lists, arrays and scalars as (its arrays, its JSON structure)."""
    arrays: dict[str, Array] = {}
    tree = _encode(value, arrays)
    return ArrayRecord(arrays), json.dumps(tree)


def decode_tree(arrays: ArrayRecord, tree) -> Any:
    """Inverse of :func:`encode_tree`; ValueError for anything it did not make (no other error escapes)."""
    try:
        return _decode(json.loads(str(tree)), arrays)
    except (ValueError, TypeError, KeyError, AttributeError, IndexError, RecursionError) as err:
        raise ValueError(f"malformed fedlib record: {type(err).__name__}: {err}") from None


def array_bytes(content: RecordDict) -> int:
    """Bytes of every ArrayRecord in ``content`` as Flower counts them (``ArrayRecord.count_bytes``)."""
    return sum(record.count_bytes() for record in content.array_records.values())


def config_bytes(content: RecordDict) -> int:
    """Bytes of every ConfigRecord in ``content`` (the JSON tree, scalars, program descriptors)."""
    return sum(record.count_bytes() for record in content.config_records.values())
