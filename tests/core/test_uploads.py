"""Servers that no client can break (fedlib.core.uploads and every server's ``expects``).

The fuzz test builds every server of the library in a state that expects uploads, makes three honest
uploads, and derives from the server's own specification every malformed variant of every entry:
wrong shape on each fixed axis (a row added, a row cut), transposed, broadcastable (a size-1 axis,
an extra axis, flattened, a 0-d value), wrong dtype, the other array type, NaN, +-Inf, negative counts,
fractional counts, all-zero counts, out-of-range numbers, huge declared sizes, a missing entry, an
extra key, a nested dict with a key missing or added. Each must be refused with a ValueError naming
its sender and entry, the server's state unchanged, and the honest round must then give the clean
result. The Flower side of the same check (a malformed node over the in-memory grid) is in
test_flower.py.
"""
from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import pytest
import torch

from fedlib.core import uploads
from fedlib.core.messages import Message
from fedlib.core.uploads import Expected, Number, Tensor, UploadCheck, check_uploads


# ------------------------------------------------------------------------------------------------
# the check itself
# ------------------------------------------------------------------------------------------------
def test_symbols_bind_across_a_round_and_local_ones_per_upload():
    form = {"W": Tensor(("d", "C")), "rows": Tensor(("n", "d"))}
    check = UploadCheck(Expected((form,), local=("n",)))
    check(Message("a", {"W": torch.zeros(4, 2, dtype=torch.float64), "rows": torch.zeros(3, 4)}))
    check(Message("b", {"W": torch.zeros(4, 2), "rows": torch.zeros(7, 4)}))     # n is each upload's own
    with pytest.raises(ValueError, match=r"refused upload from 'c': entry 'W' has shape \(5, 2\), expected \(4, 2\)"):
        check(Message("c", {"W": torch.zeros(5, 2), "rows": torch.zeros(3, 5)}))
    assert check.dims == {"d": 4, "C": 2}
    with pytest.raises(ValueError, match=r"entry 'rows' has shape \(3, 5\), expected \(n, 4\)"):
        check(Message("c", {"W": torch.zeros(4, 2), "rows": torch.zeros(3, 5)}))


def test_a_refused_upload_binds_nothing():
    check = UploadCheck(Expected(({"W": Tensor(("d",)), "x": Number(low=0)},)))
    with pytest.raises(ValueError, match="'x' must be >= 0"):
        check(Message("a", {"W": torch.zeros(3), "x": -1.0}))
    check(Message("b", {"W": torch.zeros(5), "x": 1.0}))       # d was not bound by the refused upload
    assert check.dims == {"d": 5}


def test_forms_keys_senders_and_numbers():
    exp = Expected(({"W": Tensor((2,)), "gamma": Number(low=0)}, {"B": Tensor((2,)), "gamma": Number(low=0)}),
                   senders={"client0"}, what="AFL upload")
    check_uploads([Message("client0", {"B": torch.ones(2), "gamma": 1})], exp)
    for payload, why in [({"W": torch.ones(2)}, "missing 'gamma'"),
                         ({"W": torch.ones(2), "B": torch.ones(2), "gamma": 1.0}, "unexpected 'B'|unexpected 'W'"),
                         ({"W": torch.ones(2), "gamma": float("nan")}, "'gamma' must be a finite number"),
                         ({"W": torch.ones(2), "gamma": True}, "'gamma' must be a finite number"),
                         ({"W": torch.ones(2), "gamma": "1"}, "'gamma' must be a finite number"),
                         ({"W": [1.0, 2.0], "gamma": 1.0}, "'W' must be a torch tensor, got list"),
                         ({"W": torch.ones(2, dtype=torch.int64), "gamma": 1.0}, "dtype int64, expected float32 or float64"),
                         ({"W": torch.tensor([1.0, float("inf")]), "gamma": 1.0}, "1 non-finite value"),
                         ({"W": torch.tensor([1e308, 1e308], dtype=torch.float64), "gamma": 1.0}, "too large to sum")]:
        with pytest.raises(ValueError, match=why):
            check_uploads([Message("client0", payload)], exp)
    with pytest.raises(ValueError, match=r"refused AFL upload from 'client9': this server expects uploads only from"):
        check_uploads([Message("client9", {"W": torch.ones(2), "gamma": 1.0})], exp)
    with pytest.raises(ValueError, match="must be an integer"):
        check_uploads([Message("c", {"n": 2.0})], Expected(({"n": Number(integer=True)},)))
    with pytest.raises(ValueError, match=r"must be <= 9.0072"):
        check_uploads([Message("c", {"n": 10**30})], Expected(({"n": Number(integer=True)},)))


def test_a_server_refuses_the_whole_round_before_touching_its_state():
    from fedlib.afl.algorithm import client_update, make_server

    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((60, 5)), rng.integers(0, 3, 60)
    good = [client_update(x[k::3], y[k::3], 3, client=f"client{k}") for k in range(3)]
    bad = Message("client2", {**good[2].payload, "gamma": -5.0})
    server = make_server("one_solve", dim=5, num_classes=3)
    with pytest.raises(ValueError, match=r"refused AFL upload from 'client2': entry 'gamma' must be >= 0, got -5.0"):
        server.receive(good[:2] + [bad])
    assert server.count == 0 and server.gram is None and server.gamma_sum == 0


# ------------------------------------------------------------------------------------------------
# every server, fuzzed from its own specification
# ------------------------------------------------------------------------------------------------
@dataclass
class Case:
    """A server factory (in a state that expects uploads), its honest uploads and what to compare."""

    make: Callable[[], Any]
    honest: list[Message]
    result: Callable[[Any], Any]


def _rng(seed=0):
    return np.random.default_rng(seed)


def _afl(server: str, packed: bool, statistics: bool) -> Case:
    from fedlib.afl import algorithm as afl

    rng = _rng(1)
    x, y = rng.standard_normal((90, 6)), rng.integers(0, 4, 90)
    honest = [afl.client_update(x[k::3], y[k::3], 4, 1.5, f"client{k}", packed=packed, statistics=statistics)
              for k in range(3)]
    return Case(lambda: afl.make_server(server, dim=6, num_classes=4), honest, lambda s: s.result())


def _stsa(variant: str) -> Case:
    from fedlib.stsa import algorithm as stsa

    rng = _rng(2)
    x, y = rng.standard_normal((90, 5)), rng.integers(0, 3, 90)
    rf = stsa.RandomFeatures(5, 7, seed=1)
    if variant == "stsa":
        honest = [stsa.stsa_client(x[k::3], y[k::3], 3, rf, f"client{k}") for k in range(3)]
    else:
        honest = [stsa.stsae_client(x[k::3], y[k::3], 3, rf, num_dummy=2, seed=k, sender=f"client{k}") for k in range(3)]

    def make():
        server = stsa.STSAServer(7, 5, 1.0, variant)
        server.begin_stage(rf_seed=1, M=7, stage=1, offset=2, num_classes=3)
        return server
    return Case(make, honest, lambda s: s.result())


def _stsa_path() -> Case:
    from fedlib.stsa import algorithm as stsa
    from fedlib.stsa.beyond import PathServer, StatsClient

    rng = _rng(3)
    x, y = torch.from_numpy(rng.standard_normal((90, 5))), torch.from_numpy(rng.integers(0, 3, 90))
    info = dict(rf_seed=1, M=7, stage=0, offset=0, num_classes=3)
    client = StatsClient(seed=0)
    honest = [client.step((x[k::3], y[k::3]), client.init_state(k), Message("server", info)) for k in range(3)]

    def make():
        server = PathServer(7, 3, 1.0, gamma_rule="fixed")
        server.begin_stage(**info)
        return server
    assert isinstance(honest[0]["G"], torch.Tensor) and stsa is not None
    return Case(make, honest, lambda s: s.result())


def _gradient(method: str) -> Case:
    from fedlib.federated.gradient import GradientServer, LinearHead, make_algorithm

    torch.manual_seed(0)
    model = LinearHead(4, 3)
    if method == "feddisco":   # its setup round: label counts
        honest = [Message(f"client{k}", {"label_counts": torch.tensor([3, k, 2])}) for k in range(3)]
    else:
        honest = [Message(f"client{k}", {"state": {n: v + 0.1 * k for n, v in model.state_dict().items()}, "n": 5 + k})
                  for k in range(3)]
    return Case(lambda: GradientServer(make_algorithm(method), copy.deepcopy(model), 3, num_classes=3), honest,
                lambda s: (s.model.state_dict(), s.memory))


def _fedewc_stage() -> Case:
    from fedlib.core.uploads import Expected as Exp
    from fedlib.federated.fcil import FedEWC
    from fedlib.federated.gradient import LinearHead
    from fedlib.core.protocol import Broadcaster

    torch.manual_seed(0)
    model = LinearHead(4, 3)
    entries = FedEWC().stage_entries(model, None)
    honest = [Message(f"client{k}", {"fisher": {n: torch.rand_like(p) for n, p in model.named_parameters()}, "n": 4})
              for k in range(3)]
    return Case(lambda: Broadcaster({}, Exp((entries,), what="fedewc stage upload")), honest, lambda s: s.uploads)


def _feddl(setup: bool) -> Case:
    from fedlib.fedtsne.algorithm import FedDLClient, FedDLServer

    rng = _rng(4)
    data = [rng.standard_normal((12, 5)) for _ in range(3)]
    client = FedDLClient(setup=("moments", "median"))
    states = [client.init_state(k) for k in range(3)]
    from fedlib.core.protocol import EMPTY

    setup_uploads = [client.step(d, s, EMPTY) for d, s in zip(data, states)]

    def fresh():
        return FedDLServer(4, 5, init="moments", gamma="median", seed=0)
    if setup:
        return Case(fresh, setup_uploads, lambda s: (s.Y, s.gamma, s.lr))
    ready = fresh()
    ready.receive(setup_uploads)
    honest = [client.step(d, s, ready.broadcast()) for d, s in zip(data, states)]
    return Case(lambda: copy.deepcopy(ready), honest, lambda s: s.result())


def _nystrom(kind: str) -> Case:
    from fedlib.fedtsne.algorithm import NystromServer, client_kernel, client_sq_distances

    rng = _rng(5)
    Y = rng.standard_normal((4, 3))
    data = [rng.standard_normal((n, 3)) for n in (5, 6, 7)]
    if kind == "distances":
        honest = [client_sq_distances(x, Y, f"client{k}") for k, x in enumerate(data)]
        return Case(lambda: NystromServer(Y), honest, lambda s: s.result())
    honest = [client_kernel(x, Y, 0.5, f"client{k}") for k, x in enumerate(data)]
    return Case(lambda: NystromServer(Y, "kernel", 0.5), honest, lambda s: s.result())


def _kmeans() -> Case:
    from fedlib.fedtsne.beyond import KMeansClient, KMeansServer

    rng = _rng(6)
    C = rng.standard_normal((3, 2))
    client = KMeansClient()
    honest = [client.step(rng.standard_normal((8, 2)), {"k": k}, Message("server", {"centers": C})) for k in range(3)]
    return Case(lambda: KMeansServer(C), honest, lambda s: s.result())


def _placement() -> Case:
    from fedlib.fedtsne.beyond import PlacementServer

    rng = _rng(7)
    honest = [Message(f"client{k}", {"embedding": rng.standard_normal((4 + k, 2))}) for k in range(3)]
    return Case(lambda: PlacementServer(rng.standard_normal((5, 3)), rng.standard_normal((5, 2))), honest,
                lambda s: s.result())


def _tsqr() -> Case:
    from fedlib.afl.beyond import TSQRServer, tsqr_client_update

    rng = _rng(8)
    x, y = rng.standard_normal((30, 4)), rng.integers(0, 2, 30)
    honest = [tsqr_client_update(x[k::3][: 3 + 2 * k], y[k::3][: 3 + 2 * k], 2, f"client{k}") for k in range(3)]
    return Case(lambda: TSQRServer(2, 0.5, dim=4), honest, lambda s: s.result())


def _secure_sum() -> Case:
    from fedlib.afl.beyond import SecureSumServer, stats_length

    rng = _rng(9)
    length = stats_length(3, 2)
    honest = [Message(f"client{k}", {"masked": rng.integers(0, 2**63, (2, length), dtype=np.uint64)}) for k in range(3)]
    return Case(lambda: SecureSumServer(3, 2, (10, 10)), honest, lambda s: s.total)


def _stats() -> Case:
    from fedlib.afl.beyond import StatsClient, StatsServer

    rng = _rng(10)
    x, y = rng.standard_normal((30, 4)), rng.integers(0, 2, 30)
    honest = [StatsClient(2).step((x[k::3], y[k::3]), {"name": f"client{k}"}, Message("server")) for k in range(3)]
    return Case(StatsServer, honest, lambda s: [(c.gram, c.xty, c.n) for c in s.clients])


CASES = {
    "AFL one-solve packed": lambda: _afl("one_solve", True, False),
    "AFL one-solve full": lambda: _afl("one_solve", False, False),
    "AFL one-solve statistics": lambda: _afl("one_solve", True, True),
    "AFL pairwise full": lambda: _afl("pairwise", False, False),
    "STSA": lambda: _stsa("stsa"), "STSA-E": lambda: _stsa("stsa_e"), "STSA with counts (GCV)": _stsa_path,
    "FedAvg": lambda: _gradient("fedavg"), "FedDyn": lambda: _gradient("feddyn"),
    "FedDisco set-up": lambda: _gradient("feddisco"), "FedEWC stage": _fedewc_stage,
    "FedDL set-up": lambda: _feddl(True), "FedDL round": lambda: _feddl(False),
    "Nystrom distances": lambda: _nystrom("distances"), "Nystrom kernel": lambda: _nystrom("kernel"),
    "k-means": _kmeans, "placement": _placement, "TSQR": _tsqr, "secure sum": _secure_sum,
    "client statistics": _stats,
}


# -- malformed variants, derived from the specification -------------------------------------------
def _leaves(payload: dict, form: dict, prefix: tuple = ()):
    """(path, value, spec) of every entry; a path is a tuple of keys and tuple indices."""
    for key, spec in form.items():
        path = (*prefix, key)
        value = payload[key]
        if isinstance(spec, (Tensor, Number)):
            yield path, value, spec
        elif isinstance(spec, tuple):
            for i, (v, s) in enumerate(zip(value, spec)):
                yield (*path, i), v, s
        else:
            yield path, value, spec     # a nested dict: its keys are fuzzed
            yield from _leaves(value, spec, path)


def _replace(tree, path: tuple, value):
    """``tree`` with the entry at ``path`` replaced (removed if ``value`` is _GONE)."""
    head, rest = path[0], path[1:]
    if isinstance(tree, (list, tuple)):
        seq = list(tree)
        seq[head] = _replace(seq[head], rest, value) if rest else value
        return type(tree)(seq)
    out = dict(tree)
    if rest:
        out[head] = _replace(out[head], rest, value)
    elif value is _GONE:
        del out[head]
    else:
        out[head] = value
    return out


def _show(path: tuple) -> str:
    return "".join(f"[{p}]" if isinstance(p, int) else (f".{p}" if i else str(p)) for i, p in enumerate(path))


_GONE = object()


def _fixed_axes(spec: Tensor, exp: Expected, shape) -> list[int | None]:
    """The size each axis must have (None: any, a size each upload chooses)."""
    out = []
    for d, got in zip(spec.shape, shape):
        if isinstance(d, str):
            out.append(None if d in exp.local else exp.dims.get(d, got))
        elif callable(d):
            out.append(got)
        else:
            out.append(int(d))
    return out


def _tensor_variants(value, spec: Tensor, exp: Expected):
    is_torch = isinstance(value, torch.Tensor)
    t = value if is_torch else torch.from_numpy(np.array(value))
    back = (lambda a: a) if is_torch else (lambda a: a.numpy())
    shape = tuple(t.shape)
    fixed = _fixed_axes(spec, exp, shape)
    for axis, size in enumerate(fixed):
        if size is None:
            continue
        yield f"axis {axis} + 1", back(torch.cat([t, t.narrow(axis, 0, 1)], axis) if shape[axis] else
                                       torch.zeros(*[1 if i == axis else s for i, s in enumerate(shape)], dtype=t.dtype))
        if shape[axis]:
            yield f"axis {axis} - 1", back(t.narrow(axis, 0, shape[axis] - 1))
    if t.ndim == 2 and shape[0] != shape[1] and all(f is not None for f in fixed):
        yield "transposed", back(t.T.contiguous())
    if t.ndim >= 1 and shape[0] > 1 and fixed[0] is not None:
        yield "size-1 axis (broadcastable)", back(t[:1].clone())
    yield "extra leading axis", back(t.unsqueeze(0).clone())
    if t.ndim >= 2:
        yield "flattened", back(t.flatten().clone())
    if t.ndim >= 1 and t.numel():
        yield "0-d value", back(t.reshape(-1)[0].clone())
    floating = t.is_floating_point()
    for dtype in ((torch.float16, torch.int64, torch.complex128) if floating else (torch.float64, torch.int32)):
        if str(dtype).removeprefix("torch.") not in spec.dtypes and not (dtype == torch.int32 and t.dtype == torch.uint64):
            yield f"dtype {dtype}", back(t.to(dtype))
    yield "the other array type", value.numpy() if is_torch else torch.from_numpy(np.array(value))
    yield "a list", t.tolist()
    if not t.numel():
        return
    if floating:
        for bad in (float("nan"), float("inf"), -float("inf")):
            v = t.clone(memory_format=torch.contiguous_format)
            v.reshape(-1)[0] = bad
            yield f"first value {bad}", back(v)
    if spec.low is not None and spec.low >= 0 and t.dtype != torch.uint64:
        v = t.clone(memory_format=torch.contiguous_format)
        v.reshape(-1)[0] = -1
        yield "negative value", back(v)
    if spec.high is not None:
        v = t.clone(memory_format=torch.contiguous_format)
        v.reshape(-1)[0] = spec.high + 1
        yield "value above its bound", back(v)
    if spec.integral and floating:
        v = t.clone(memory_format=torch.contiguous_format)
        v.reshape(-1)[0] += 0.5
        yield "fractional count", back(v)
    if spec.nonzero:
        yield "all zero", back(torch.zeros_like(t))


def _number_variants(value, spec: Number):
    yield "NaN", float("nan")
    yield "+Inf", float("inf")
    yield "a string", "1"
    yield "a bool", True
    yield "a list", [value]
    yield "None", None
    if spec.integer:
        yield "a float", float(value) + 0.5
        yield "huge declared size", 10 ** 30
    if spec.low is not None:
        yield "below its bound", spec.low - 5
    if isinstance(spec.high, (int, float)):
        yield "above its bound", spec.high + 1
    if spec.bind is not None:
        yield "a declared size one larger", int(value) + 1


def malformed(upload: Message, exp: Expected):
    """(what, entry path or None, malformed upload) for every variant the specification makes invalid."""
    form = next(f for f in exp.forms if set(f) == set(upload.payload))
    for key in form:
        if any(set(f) == set(form) - {key} for f in exp.forms):
            continue    # another form of the upload (e.g. a placement that keeps its positions)
        yield f"missing {key!r}", key, Message(upload.sender, _replace(upload.payload, (key,), _GONE))
    yield "extra key", "extra", Message(upload.sender, {**upload.payload, "extra": 1.0})
    for path, value, spec in _leaves(upload.payload, form):
        if isinstance(spec, Tensor):
            variants = _tensor_variants(value, spec, exp)
        elif isinstance(spec, Number):
            variants = _number_variants(value, spec)
        else:   # a nested dict
            first = next(iter(spec))
            variants = [("a nested key missing", {k: v for k, v in value.items() if k != first}),
                        ("a nested key added", {**value, "extra": value[first]}), ("not a dict", [1.0])]
        for what, bad in variants:
            yield f"{_show(path)}: {what}", path[0], Message(upload.sender, _replace(upload.payload, path, bad))


def same(a, b) -> bool:
    """Deep equality of server states (tensors and arrays bit for bit, NaN equal to NaN)."""
    if isinstance(a, torch.nn.Module):
        return same(a.state_dict(), b.state_dict())
    if isinstance(a, np.random.Generator):
        return same(a.bit_generator.state, b.bit_generator.state)
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.shape == b.shape and a.dtype == b.dtype and torch.equal(
            torch.nan_to_num(a, nan=1.5), torch.nan_to_num(b, nan=1.5))
    if isinstance(a, np.ndarray):
        return isinstance(b, np.ndarray) and a.shape == b.shape and np.array_equal(a, b, equal_nan=a.dtype.kind == "f")
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    if hasattr(a, "__dict__") and not callable(a) and type(a).__module__.startswith("fedlib"):
        return type(a) is type(b) and same(vars(a), vars(b))
    return a is b or a == b or (callable(a) and callable(b))


def _snapshot(server):
    return {k: v for k, v in copy.deepcopy(vars(server)).items() if k not in ("seconds",)}


@pytest.mark.parametrize("name", list(CASES))
def test_every_malformed_upload_is_refused_and_changes_nothing(name):
    case = CASES[name]()
    clean = case.make()
    clean.receive(case.honest)
    want = case.result(clean)
    exp = case.make().expects()
    tried = 0
    for what, entry, bad in malformed(case.honest[2], exp):
        server = case.make()
        before = _snapshot(server)
        try:
            server.receive([*case.honest[:2], bad])
        except ValueError as err:
            text = str(err)
        else:
            pytest.fail(f"{name}, {what}: accepted")
        assert f"from {bad.sender!r}" in text and f"'{entry}" in text, f"{name}, {what}: {text}"
        assert same(_snapshot(server), before), f"{name}, {what}: the refused round changed the server's state"
        server.receive(case.honest)
        assert same(case.result(server), want), f"{name}, {what}: the honest round after the refusal differs"
        tried += 1
    assert tried >= 10, (name, tried)
    FUZZ_COUNTS[name] = tried


FUZZ_COUNTS: dict[str, int] = {}


def test_afl_kernels_check_sizes_before_reading_memory():
    """The compiled AFL loops index without bounds checks: their entry points refuse any size mismatch."""
    from fedlib.afl import speed as afl_speed

    gram, rhs = torch.zeros(afl_speed.packed_length(4), dtype=torch.float64), torch.zeros(3, 4, dtype=torch.float64)
    with pytest.raises(ValueError, match="cannot add one of shape"):
        afl_speed.absorb_packed(gram, rhs, torch.ones(afl_speed.packed_length(5), dtype=torch.float64), torch.ones(4, 3))
    with pytest.raises(ValueError, match="head"):
        afl_speed.absorb_packed(gram, rhs, torch.ones(afl_speed.packed_length(4), dtype=torch.float64), torch.ones(4, 4))
    with pytest.raises(ValueError, match="cannot add one of shape"):
        afl_speed.absorb_full(torch.zeros(4, 4, dtype=torch.float64), rhs, torch.ones(5, 5), torch.ones(4, 3))


def test_a_server_with_earlier_uploads_refuses_other_sizes():
    """The crash cases of the report: an upload consistent in itself whose d or C differs from the server's
    sums (it used to kill the process), a head of (d, C+1), W = 1e6 x ones(4, 4)."""
    from fedlib.afl import algorithm as afl

    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((40, 4)), rng.integers(0, 3, 40)
    first = afl.client_update(x, y, 3, client="client0")
    for packed in (True, False):
        other = afl.client_update(rng.standard_normal((40, 6)), rng.integers(0, 3, 40), 3, client="client1",
                                  packed=packed)
        wide = afl.client_update(x, rng.integers(0, 4, 40), 4, client="client1", packed=packed)
        for server in ("one_solve", "pairwise"):
            srv = afl.make_server(server)
            srv.receive([first])
            for bad, why in ((other, r"expected \(4, 3\)"), (wide, r"expected \(4, 3\)"),
                             (Message("client1", {"W": 1e6 * torch.ones(4, 4, dtype=torch.float64),
                                                  "C": torch.eye(4, dtype=torch.float64), "gamma": 1.0}), "expected")):
                with pytest.raises(ValueError, match=why):
                    srv.receive([bad])
            assert srv.count == 1
    assert uploads.MAX_COUNT == 2**53


def test_the_aggregation_helpers_refuse_arrays_they_would_broadcast_or_truncate():
    """Behind the servers' checks: FedAvg's average and FedDL's axpy never broadcast a (1,) bias or a
    (3, 1) weight, nor update a prefix of a flattened array."""
    from fedlib.federated.gradient import average_states
    from fedlib.fedtsne.speed import add_scaled

    a = {"w": torch.ones(3, 2), "b": torch.ones(3)}
    assert torch.equal(average_states([a, a], [0.5, 0.5])["w"], torch.ones(3, 2))
    for bad in ({"w": torch.ones(3, 1), "b": torch.ones(3)}, {"w": torch.ones(3, 2), "b": torch.ones(1)},
                {"w": torch.ones(3, 2)}):
        with pytest.raises(ValueError, match="state 1 does not match state 0"):
            average_states([a, bad], [0.5, 0.5])
    with pytest.raises(ValueError, match=r"cannot add an array of shape \(2, 3\) to one of shape \(3, 2\)"):
        add_scaled(np.zeros((3, 2)), np.ones((2, 3)), 1.0)


def test_the_flower_page_states_how_many_malformed_uploads_the_fuzz_test_tries():
    from fedlib.core.paths import REPO

    total = 0
    for make in CASES.values():
        case = make()
        total += sum(1 for _ in malformed(case.honest[2], case.make().expects()))
    assert f"receives {total} malformed uploads" in (REPO / "book" / "flower.md").read_text()
