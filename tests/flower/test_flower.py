"""fedlib.flower without a Flower engine: records, options, and every protocol over an in-memory Grid
whose nodes run the real node code (:func:`fedlib.flower.transport.answer`) with their own Flower
Context, so equality with the in-process runs and the fault handling are checked in seconds.
The engines themselves are tested in test_flower_simulation.py and test_flower_deployment.py."""
from __future__ import annotations


import numpy as np
import pytest
import torch

pytest.importorskip("flwr")

from conftest import afl_ridge_reference  # noqa: E402
from flwr.app import ArrayRecord, Context, RecordDict  # noqa: E402
from flwr.app import Message as FlowerMessage  # noqa: E402
from flwr.supercore.task_identity import TaskIdentity  # noqa: E402

from fedlib.core import protocol  # noqa: E402
from fedlib.core.messages import Message as FedMessage  # noqa: E402
from fedlib.flower import apps, records, transport  # noqa: E402
from fedlib.flower import programs as programs_mod  # noqa: E402
from fedlib.flower.tasks import OPTIONS, Task, parse_options  # noqa: E402


# ------------------------------------------------------------------------------------------------
def test_records_round_trip_is_lossless():
    payload = {"W": torch.randn(5, 3, dtype=torch.float64), "n": 7, "gamma": 1.5, "name": "c1", "none": None,
               "flag": True, "labels": np.arange(4), "scalar": np.float32(2.5), 3: "int key",
               "nested": {"t": (torch.ones(2, dtype=torch.int64), [np.zeros((1, 2)), 4.0])}}
    content = records.to_records(FedMessage("client3", payload), client=3)
    back = records.from_records(content)
    assert back.sender == "client3" and back.payload.keys() == payload.keys()
    assert torch.equal(back["W"], payload["W"]) and back["W"].dtype == torch.float64
    assert back["n"] == 7 and back["gamma"] == 1.5 and back["none"] is None and back["flag"] is True
    assert back["scalar"] == np.float32(2.5) and back["scalar"].dtype == np.float32
    assert back[3] == "int key" and np.array_equal(back["labels"], np.arange(4))
    t, (z, four) = back["nested"]["t"]
    assert torch.equal(t, torch.ones(2, dtype=torch.int64)) and z.shape == (1, 2) and four == 4.0
    data = payload["W"].numpy().nbytes + payload["labels"].nbytes + 16 + 16
    assert data < records.array_bytes(content) < data + 4 * 200      # data + .npy headers and key names
    with pytest.raises(ValueError, match="not a fedlib message"):
        records.from_records(RecordDict({"x": ArrayRecord()}))
    with pytest.raises(TypeError, match="cannot send"):
        records.to_records(FedMessage("c", {"f": object()}))


def test_client_programs_travel_as_data_and_nodes_build_only_fedlib_programs():
    """Every client program a task hands to simulate is described as JSON (no pickle, no callable) and
    rebuilt on the node with the same description; an unknown program, method or policy is refused."""
    import json

    from fedlib.federated.fcil import FedEWC
    from fedlib.federated.gradient import FedConfig, FedProx, GradientClient, MLPHead
    from fedlib.federated.learner import CacheClient, RandomReplay, StageClient, StateInit
    from fedlib.afl.algorithm import AFLClient
    from fedlib.fedtsne.algorithm import FedDLClient
    from fedlib.refed.algorithm import RefedReplay

    task = Task(parse_options("refed", ""))
    model, config = task.model(), FedConfig(rounds=2, device="cpu")
    programs = [AFLClient(10, 2.0, torch.float32, packed=False), FedDLClient(seed=3, landmark_bounds=(0.0, 1.0),
                                                                             setup=("moments",)),
                GradientClient(FedProx(mu=0.1), model, config, 10), StageClient(FedEWC(lam=5.0), model, config, ["proj.weight"]),
                CacheClient(RefedReplay(50, lam=0.5, pim_epochs=2), model, config, 10, ["proj.weight"]),
                CacheClient(RandomReplay(20), torch.nn.Identity(), config, 10, []), StateInit(FedEWC(), 4)]
    for program in programs:
        text = programs_mod.describe(program)
        assert json.loads(text) and "\\x" not in text
        rebuilt = programs_mod.build(text, task)
        assert type(rebuilt) is type(program) and programs_mod.describe(rebuilt) == text
    assert programs_mod.build(programs_mod.describe(programs[0]), task) == programs[0]
    with pytest.raises(TypeError, match="not a client program that can run over Flower"):
        programs_mod.describe(object())
    with pytest.raises(ValueError, match="unknown client program 'os.system'"):
        programs_mod.build(json.dumps({"program": "os.system"}), task)
    bad = json.loads(programs_mod.describe(programs[4]))
    bad["replay"]["class"] = "Popen"
    with pytest.raises(ValueError, match="unknown replay policy 'Popen'"):
        programs_mod.build(json.dumps(bad), task)
    bad = json.loads(programs_mod.describe(programs[2]))
    bad["model"]["state"][0][1] = [1, 1]
    with pytest.raises(ValueError, match="differs from this node's model"):
        programs_mod.build(json.dumps(bad), task)
    assert isinstance(MLPHead(4, 2), torch.nn.Module)


def test_options_are_checked_before_work():
    assert parse_options("afl", "num-clients=5 gamma=2")["gamma"] == 2.0
    with pytest.raises(ValueError, match="unknown option 'rounds' for protocol 'afl'"):
        parse_options("afl", "rounds=3")
    with pytest.raises(ValueError, match="option num-clients must be int"):
        parse_options("afl", "num-clients=three")
    with pytest.raises(ValueError, match="alpha .the Dirichlet concentration. must be a finite number > 0"):
        parse_options("gradient", "alpha=0")
    for bad in ("nan", "inf", "-1", "0"):     # a round's wait must be a finite number of seconds
        with pytest.raises(ValueError, match="timeout .seconds per round. must be a finite number > 0"):
            parse_options("afl", f"timeout={bad}")
    with pytest.raises(ValueError, match="min-clients must be an integer >= 1 and <= 3"):
        parse_options("afl", "min-clients=4")
    assert parse_options("afl", "min-clients=3")["min-clients"] == 3
    with pytest.raises(ValueError, match="protocol"):
        parse_options("fedsgd")
    with pytest.raises(ValueError, match="key=value"):
        parse_options("afl", "gamma")
    with pytest.raises(ValueError, match="unknown upload 'gram'; allowed: weights, statistics"):
        parse_options("afl", "upload=gram")
    with pytest.raises(ValueError, match="unknown server 'recursive'"):
        parse_options("afl", "server=recursive")
    assert set(OPTIONS) == {"afl", "stsa", "gradient", "feddl", "refed"}


# ------------------------------------------------------------------------------------------------
class LoopbackGrid:
    """A Grid whose node i answers with :func:`fedlib.flower.transport.answer` on its own Context
    (fault ``kind`` per node as in the ClientApp; "drop": never answers; "unavailable": Flower's own
    error reply for a node that stopped sending heartbeats, from the SuperLink's node id 0). Message
    ids are set on push, as Flower's grids do."""

    def __init__(self, task: Task, faults: dict[int, str] | None = None):
        self.task, self.faults = task, faults or {}
        self.contexts = {100 + k: Context(0, 100 + k, {"partition-id": k}, RecordDict(), {})
                         for k in range(task.config["num-clients"])}

    def get_node_ids(self):
        return list(self.contexts)

    def send_and_receive(self, messages, timeout=None):
        from flwr.app import Error

        replies = []
        for i, m in enumerate(messages):
            m.metadata.__dict__["_message_id"] = f"m{id(m)}.{i}"
            node = m.metadata.dst_node_id
            kind = self.faults.get(node - 100, "")
            if callable(kind):      # a node whose uploads this function damages
                damage, kind = kind, ""
            else:
                damage = apps.corrupt(kind) if kind in ("nan", "shape") else None
            if kind == "drop":
                continue
            if kind == "unavailable":
                reply = FlowerMessage(Error(5, "Error: Node Unavailable - no heartbeat"), reply_to=m)
                reply.metadata.__dict__["_src_node_id"] = 0
                replies.append(reply)
                continue
            TaskIdentity.node_id = node
            task = apps._task(str(m.content.config_records[records.META]["task"]))
            replies.append(transport.answer(m, self.contexts[node], task, damage))
            TaskIdentity.node_id = 0
        return replies


@pytest.fixture
def identity():
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 0, 0
    yield
    TaskIdentity.run_id = TaskIdentity.node_id = TaskIdentity.task_id = None


def over_grid(config, faults=None):
    task = Task(config)
    grid = LoopbackGrid(task, faults)
    nodes = {k: 100 + k for k in range(config["num-clients"])}
    t = transport.FlowerTransport(grid, nodes, 5.0, stage=lambda: task.stage, task=task.key,
                                  min_clients=config["min-clients"])
    with protocol.transport(t):
        return task, task.run(), t


CASES = [("afl", ""), ("afl", "server=pairwise"), ("afl", "upload=statistics"), ("stsa", ""), ("stsa", "method=STSA-E"),
         ("gradient", "method=fedavg participation=0.67"), ("gradient", "method=fedprox"),
         ("gradient", "method=feddyn"), ("gradient", "method=fedntd"), ("gradient", "method=moon"),
         ("gradient", "method=feddisco"), ("feddl", ""), ("feddl", "mode=average"), ("refed", "")]


@pytest.mark.parametrize("protocol_name,options", CASES)
def test_every_protocol_over_a_grid_equals_in_process(identity, protocol_name, options):
    config = parse_options(protocol_name, options)
    reference = Task(config).run()
    _, outcome, t = over_grid(config)
    assert outcome.arrays.keys() == reference.arrays.keys()
    assert outcome.difference(reference.arrays) == 0.0
    assert outcome.summary["fedlib_bytes_up"] == reference.summary["fedlib_bytes_up"]
    report = t.report()
    assert report["answered"] == list(range(config["num-clients"])) and not report["rejected"]
    flower = report["flower_bytes"]
    assert reference.summary["fedlib_bytes_up"] <= flower["array_up"] < 1.1 * reference.summary["fedlib_bytes_up"] + 5e3


def test_afl_statistics_upload_gives_the_weights_uploads_head(identity):
    """upload=statistics (B_k = X_k^T Y_k in place of W_k^r) over the grid: the same heads and bytes up."""
    weights = Task(parse_options("afl", "")).run()
    _, stats, _ = over_grid(parse_options("afl", "upload=statistics"))
    assert stats.difference(weights.arrays) < 1e-10
    assert stats.summary["fedlib_bytes_up"] == weights.summary["fedlib_bytes_up"]


@pytest.mark.parametrize("fault", ["nan", "shape", "drop", "unavailable"])
def test_afl_fault_leaves_out_one_client_and_equals_centralized_ridge(identity, fault):
    config = parse_options("afl", "num-clients=4")
    task, outcome, t = over_grid(config, {2: fault})
    report = t.report()
    assert report["answered"] == [0, 1, 3]
    if fault == "drop":
        assert report["missing"] == [2]
    else:
        why = report["rejected"]["2"]
        expect = {"nan": "non-finite", "shape": "has shape", "unavailable": "Flower error 5: Error: Node Unavailable"}
        assert expect[fault] in why and not report["missing"], why
    assert outcome.summary["clients_aggregated"] == 3
    assert outcome.difference({"weights_regularized": afl_ridge_reference(task, [0, 1, 3])}) < 1e-10


def _first_array(kind: str):
    """A faulty node's upload: ``kind`` applied to its first array (depth first), or to its keys or sender."""
    def change(value):
        is_torch = isinstance(value, torch.Tensor)
        if kind == "extra axis":
            return value[None]
        if kind == "dtype":
            floating = value.is_floating_point() if is_torch else value.dtype.kind == "f"
            target = (torch.float16 if floating else torch.float64) if is_torch else (np.float16 if floating else np.float64)
            return value.to(target) if is_torch else value.astype(target)
        return value.numpy() if is_torch else torch.from_numpy(np.array(value))   # the other array type

    def first(tree):
        for key, value in tree.items():
            if isinstance(value, dict):
                found = first(value)
                if found is not None:
                    return {**tree, key: found}
            elif np.ndim(value) >= 1:
                return {**tree, key: change(value)}
        return None

    def upload(message):
        payload = message.payload
        if kind == "missing entry":
            payload = dict(list(payload.items())[1:])
        elif kind == "extra key":
            payload = {**payload, "extra": np.zeros(2)}
        elif kind == "sender":
            return FedMessage("client0", payload)
        elif kind in ("nan", "shape"):
            return apps.corrupt(kind)(message)
        else:
            payload = first(payload) or payload
        return FedMessage(message.sender, payload)
    return upload


GRID_FUZZ = ["nan", "shape", "extra axis", "dtype", "array type", "missing entry", "extra key", "sender"]
GRID_CASES = [("afl", ""), ("afl", "server=pairwise upload=statistics"), ("stsa", ""), ("stsa", "method=STSA-E"),
              ("gradient", "method=fedavg"), ("gradient", "method=feddisco"), ("feddl", ""), ("refed", "")]


@pytest.mark.parametrize("protocol_name,options", GRID_CASES)
def test_a_malformed_node_is_left_out_and_the_honest_clients_give_the_clean_result(identity, protocol_name, options):
    """Over the in-memory grid, node 2 sends every round's upload malformed (each kind of GRID_FUZZ): the
    run goes on, node 2 is reported with the server's refusal, and the result is exactly that of the
    run where node 2 never answers."""
    config = parse_options(protocol_name, options)
    _, dropped, _ = over_grid(config, {2: "drop"})
    for kind in GRID_FUZZ:
        _, outcome, t = over_grid(config, {2: _first_array(kind)})
        why = t.report()["rejected"].get("2", "")
        assert why.startswith("malformed upload: "), (kind, t.report())
        assert ("is not client2" in why) if kind == "sender" else ("refused" in why and "from 'client2'" in why), why
        assert outcome.difference(dropped.arrays) == 0.0, (protocol_name, options, kind)


def test_too_few_valid_uploads_stop_the_run_with_one_clear_reason(identity):
    config = parse_options("afl", "num-clients=3 min-clients=2")
    with pytest.raises(transport.TooFewClients, match=r"step 1 round 1: 1 of 3 clients sent a valid upload, fewer "
                                                       r"than the 2 the run needs \(min-clients\) - client 1: "
                                                       r"malformed upload: refused AFL upload from 'client1'"):
        over_grid(config, {1: "nan", 2: "drop"})


def test_outcome_difference_flags_nan_placement_and_shape():
    from fedlib.flower.tasks import Outcome

    ref = {"a": np.array([[1.0, np.nan], [2.0, 4.0]])}
    assert Outcome({"a": np.array([[1.0, np.nan], [2.0, 4.2]])}, {}).difference(ref) == pytest.approx(0.05)
    assert Outcome({"a": np.array([[1.0, 3.0], [2.0, 4.0]])}, {}).difference(ref) == float("inf")
    assert Outcome({"a": np.ones(3)}, {}).difference(ref) == float("inf")
    assert Outcome({}, {}).difference(ref) == float("inf")


def test_engines_refuse_bad_runs_before_starting(tmp_path):
    from fedlib.flower.engines import run_deployment, run_simulation_engine

    config = parse_options("afl", "num-clients=5000")
    with pytest.raises(ValueError, match="num_clients"):
        run_simulation_engine(config)
    with pytest.raises(ValueError, match="num_clients"):
        run_deployment(config, tmp_path)
    with pytest.raises(ValueError, match="dataset"):
        run_simulation_engine(parse_options("afl", "dataset=nope"))


def test_node_caches_are_bounded():
    cache, made = {}, []
    for k in range(5):
        assert transport.remember(cache, k, lambda k=k: made.append(k) or k * 10, size=3) == k * 10
    assert list(cache) == [2, 3, 4] and made == [0, 1, 2, 3, 4]
    assert transport.remember(cache, 4, lambda: 1 / 0, size=3) == 40       # a hit makes nothing


def test_cli_bad_option_is_one_error_line():
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "fedlib.flower", "simulate", "afl", "bogus=1"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 1 and "Traceback" not in out.stderr
    assert out.stderr.strip() == ("error: unknown option 'bogus' for protocol 'afl'; allowed: alpha, dataset, "
                                  "gamma, min-clients, num-clients, partition, seed, server, timeout, upload")
