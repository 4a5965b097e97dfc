"""The four papers' federated protocols as Flower tasks: one run configuration, the data a node
holds, and the run itself through fedlib's own orchestration code.

A run is named by a flat configuration (:func:`parse_options`: ``key=value`` pairs, defaults in
:data:`OPTIONS`), the same on the server and on every node. The server runs the method's in-process
orchestration (:func:`fedlib.afl.algorithm.run_afl`, :func:`fedlib.federated.gradient.run_federated`,
:func:`fedlib.federated.incremental.run_class_incremental` with the STSA or Re-Fed learner,
FedDL then the Nystrom step) unchanged: inside ``protocol.transport(FlowerTransport(...))`` every
``simulate`` call becomes a Flower round, and each node computes its client's upload from
``Task.client_data(k, stage)``, the very data the in-process run hands to client k at that step
(fedlib's partition of the dataset, rebuilt on the node from the same configuration and seed).
The server builds the same partition only for the orchestration's argument and shape checks; no
client step runs on the server.
"""
from __future__ import annotations

import inspect
import json
from dataclasses import dataclass
from functools import cached_property, partial
from typing import Any

import numpy as np
import torch

from fedlib.afl.algorithm import SERVERS, ClientRows, run_afl
from fedlib.afl.studies import baseline_model_fn
from fedlib.core.linalg import as_tensor, relative_error
from fedlib.core.protocol import simulate
from fedlib.core.validate import check_choice, check_int, check_positive
from fedlib.data.features import load_features
from fedlib.data.partition import make_partition
from fedlib.data.streams import make_stream
from fedlib.federated.gradient import FedConfig, LinearHead, MLPHead, make_algorithm, run_federated
from fedlib.federated.incremental import run_class_incremental
from fedlib.fedtsne.algorithm import NystromClient, NystromServer
from fedlib.fedtsne.feddl import FedDLRun, feddl
from fedlib.fedtsne.mmd import split_clients
from fedlib.refed import algorithm as refed
from fedlib.stsa.studies import make_fcil_learner

PROTOCOLS = ("afl", "stsa", "gradient", "feddl", "refed")

COMMON = {"dataset": "optdigits", "num-clients": 3, "partition": "dirichlet", "alpha": 0.5, "seed": 0,
          "timeout": 120.0, "min-clients": 1}
#: every option of every protocol with its default (the type of the default is the allowed type)
OPTIONS: dict[str, dict[str, Any]] = {
    "afl": {**COMMON, "gamma": 1.0, "server": "one_solve", "upload": "weights"},
    "stsa": {**COMMON, "alpha": 1.0, "method": "STSA", "num-tasks": 2, "M": 256, "gamma": 1.0, "num-dummy": 2},
    "gradient": {**COMMON, "method": "fedavg", "rounds": 3, "local-epochs": 1, "batch-size": 32, "lr": 0.05,
                 "participation": 1.0},
    "feddl": {**COMMON, "n-landmarks": 20, "rounds": 10, "mode": "gradient"},
    "refed": {**COMMON, "alpha": 1.0, "method": "refed", "num-tasks": 2, "memory": 400, "rounds": 2,
              "local-epochs": 1, "batch-size": 32, "lr": 0.05, "pim-epochs": 1},
}
PARTITIONS = ("dirichlet", "iid")
#: AFL's upload beside the packed Gram: the head W_k^r (the paper's) or B_k = X_k^T Y_k (fedlib.afl.algorithm)
AFL_UPLOADS = ("weights", "statistics")


def parse_options(protocol: str, options: str | dict | None = None) -> dict[str, Any]:
    """The full configuration of ``protocol`` from ``"key=value key=value"`` (or a dict), checked:
    unknown keys and values of the wrong type raise ValueError naming the key and what is allowed."""
    check_choice("protocol", protocol, PROTOCOLS)
    allowed = OPTIONS[protocol]
    given = options if isinstance(options, dict) else dict(_pairs(options or ""))
    config = {"protocol": protocol, **allowed}
    for key, value in given.items():
        if key == "protocol":
            continue
        if key not in allowed:
            raise ValueError(f"unknown option {key!r} for protocol {protocol!r}; allowed: {', '.join(sorted(allowed))}")
        config[key] = _typed(key, value, allowed[key])
    check_choice("partition", config["partition"], PARTITIONS)
    if protocol == "afl":
        check_choice("server", config["server"], SERVERS)
        check_choice("upload", config["upload"], AFL_UPLOADS)
    check_int("num-clients", config["num-clients"], 1)
    check_int("min-clients", config["min-clients"], 1, config["num-clients"])
    check_positive("alpha (the Dirichlet concentration)", config["alpha"])
    check_positive("timeout (seconds per round)", config["timeout"])
    return config


def _pairs(text: str):
    for item in text.split():
        if "=" not in item:
            raise ValueError(f"options are key=value pairs separated by spaces, got {item!r}")
        yield tuple(item.split("=", 1))


def _typed(key: str, value: Any, default: Any) -> Any:
    kind = type(default)
    try:
        if kind is int and isinstance(value, str):
            return int(value)
        if kind is float and isinstance(value, (str, int)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, kind) and not (kind is int and isinstance(value, bool)):
            return value
    except ValueError:
        pass
    raise ValueError(f"option {key} must be {kind.__name__} (like {default!r}), got {value!r}")


def options_string(config: dict[str, Any]) -> str:
    """``config`` back as the ``key=value`` string :func:`parse_options` reads."""
    return " ".join(f"{k}={v}" for k, v in config.items() if k != "protocol")


# ------------------------------------------------------------------------------------------------
@dataclass
class Outcome:
    """What a run produced: ``arrays`` (the model or estimate, compared across engines) and ``summary``
    (JSON-able: accuracy, fedlib's measured bytes)."""

    arrays: dict[str, np.ndarray]
    summary: dict[str, Any]

    def difference(self, reference: dict[str, np.ndarray]) -> float:
        """max over arrays of max |a - b| / max |b| against ``reference`` (the same arrays; NaN entries,
        e.g. the accuracy matrix's unseen tasks, must sit at the same places); inf if they differ."""
        

        worst = 0.0
        for name, want in reference.items():
            got = self.arrays.get(name)
            if got is None or got.shape != want.shape or not np.array_equal(np.isnan(got), np.isnan(want)):
                return float("inf")
            keep = ~np.isnan(want)
            if keep.any():
                worst = max(worst, relative_error(got[keep], want[keep]))
        return worst


class Task:
    """One protocol run of ``config`` (from :func:`parse_options`)."""

    def __init__(self, config: dict[str, Any]):
        self.config = dict(config)
        self.protocol = config["protocol"]
        self.stage = 0          # the data key of the coming simulate() call (incremental: the task t)
        self._stages: dict[int, Any] = {}

    @property
    def key(self) -> str:
        return json.dumps(self.config, sort_keys=True)

    # -- data ---------------------------------------------------------------------------------------
    @cached_property
    def features(self):
        return load_features(self.config["dataset"], backbone="raw", progress=False)

    @cached_property
    def parts(self) -> list[np.ndarray]:
        c = self.config
        alpha = c["alpha"] if c["partition"] == "dirichlet" else None
        return make_partition(self.features.y_train, c["num-clients"], c["partition"], alpha=alpha, seed=c["seed"])

    @cached_property
    def stream(self):
        f = self.features
        return make_stream(f.y_train, f.y_test, self.config["num-tasks"], seed=self.config["seed"])

    @property
    def min_size(self) -> int:
        return self.config["num-dummy"] if self.protocol == "stsa" else 1

    def stage_data(self, stage: int):
        """The list the in-process run passes to ``simulate`` at ``stage`` (client k's data is [k])."""
        if stage not in self._stages:
            self._stages[stage] = self._make_stage(stage)
        return self._stages[stage]

    def check(self) -> "Task":
        """Load the data and draw the first stage's partition now: a missing dataset or more clients
        than samples fails here, before any engine starts."""
        self.stage_data(0)
        return self

    def client_data(self, k: int, stage: int):
        return self.stage_data(stage)[k]

    def _make_stage(self, stage: int):
        f, c = self.features, self.config
        if self.protocol == "afl":
            return ClientRows(as_tensor(f.x_train, torch.float64, "cpu"), np.asarray(f.y_train), self.parts)
        if self.protocol == "gradient":
            x, y = torch.as_tensor(f.x_train), torch.as_tensor(f.y_train, dtype=torch.long)
            return [(x[p], y[p]) for p in self.parts]
        if self.protocol == "feddl":
            return split_clients(np.asarray(f.x_train, dtype=np.float64), self.parts, c["seed"])[0]
        pos = self.stream.relabel(f.y_train)
        parts = self.stream.client_partitions(stage, f.y_train, c["num-clients"], c["alpha"], c["seed"], self.min_size)
        return [(torch.as_tensor(f.x_train[p]), torch.from_numpy(pos[p])) for p in parts]

    # -- the model a node trains (gradient programs) ---------------------------------------------------
    def model(self):
        """A model of this run's architecture (its weights are replaced by the broadcast's)."""
        f, c = self.features, self.config
        if self.protocol == "gradient":
            return baseline_model_fn(c["method"], f.dim, len(f.classes))()
        if self.protocol == "refed":
            return MLPHead(f.dim, len(f.classes))
        return LinearHead(f.dim, len(f.classes))   # STSA's gradient baselines (make_fcil_learner)

    # -- the run ------------------------------------------------------------------------------------
    def run(self, progress: bool = False) -> Outcome:
        """The protocol's in-process orchestration (over Flower inside ``protocol.transport``)."""
        return getattr(self, f"_run_{self.protocol}")(progress)

    def _accuracy(self, predict) -> float:
        f = self.features
        pred = predict(torch.as_tensor(f.x_test))
        return float((np.asarray(pred) == np.asarray(f.y_test)).mean())

    def _run_afl(self, progress) -> Outcome:
        c, f = self.config, self.features
        res = run_afl(f.x_train, f.y_train, self.parts, len(f.classes), c["gamma"], c["server"], progress=progress,
                      one_round=True, statistics=c["upload"] == "statistics")
        W = res.weights.numpy()
        acc = self._accuracy(lambda x: (x.double() @ res.weights).argmax(1).numpy())
        return Outcome({"weights": W, "weights_regularized": res.weights_regularized.numpy(),
                        "gram": res.gram_regularized.numpy()},
                       {"accuracy": acc, "clients_aggregated": res.num_clients, **_cost(res.cost)})

    def _run_gradient(self, progress) -> Outcome:
        c, f = self.config, self.features
        config = FedConfig(rounds=c["rounds"], local_epochs=c["local-epochs"], batch_size=c["batch-size"], lr=c["lr"],
                           participation=c["participation"], seed=c["seed"], device="cpu")
        test = (torch.as_tensor(f.x_test), torch.as_tensor(f.y_test, dtype=torch.long))
        hist = run_federated(baseline_model_fn(c["method"], f.dim, len(f.classes)), self.stage_data(0), test,
                             make_algorithm(c["method"]), config, progress=progress, num_classes=len(f.classes))
        arrays = {f"state.{k}": v.numpy() for k, v in hist.final_state.items()}
        return Outcome(arrays, {"accuracy": hist.final_acc, "accuracy_per_round": list(map(float, hist.test_acc)),
                                "participants": hist.participants, **_cost(hist.cost)})

    def _run_feddl(self, progress) -> Outcome:
        c = self.config
        data = self.stage_data(0)
        run = FedDLRun.start(data, c["n-landmarks"], **_feddl_defaults(feddl, rounds=c["rounds"], mode=c["mode"],
                                                                          seed=c["seed"]))
        run.advance(run.planned, progress)
        landmarks = run.server.result()[0]
        nystrom = NystromServer(landmarks, "distances")
        cost = simulate(nystrom, NystromClient("distances"), data)
        return Outcome({"landmarks": np.asarray(landmarks), "distances": nystrom.result()},
                       {"gamma": float(run.server.gamma), "feddl": _cost(run.cost), "nystrom": _cost(cost),
                        **_cost(run.cost + cost)})

    def _run_incremental(self, learner, progress) -> Outcome:
        c, f = self.config, self.features
        res = run_class_incremental(_Staged(learner, self), self.stream, f.x_train, f.y_train, f.x_test, f.y_test,
                                    c["num-clients"], c["alpha"], c["seed"], progress=progress, min_size=self.min_size)
        total = sum(res.costs[1:], res.costs[0])
        return learner, Outcome({"accuracy_matrix": res.acc}, {"top1": list(map(float, res.top1)), **_cost(total)})

    def _run_stsa(self, progress) -> Outcome:
        c, f = self.config, self.features
        learner = make_fcil_learner(c["method"], f.dim, len(f.classes), c["M"], c["gamma"], c["seed"],
                                    num_dummy=c["num-dummy"])
        learner, out = self._run_incremental(learner, progress)
        out.arrays["weights"] = learner.weights.numpy()
        return out

    def _run_refed(self, progress) -> Outcome:
        c, f = self.config, self.features
        config = FedConfig(rounds=c["rounds"], local_epochs=c["local-epochs"], batch_size=c["batch-size"], lr=c["lr"],
                           seed=c["seed"], device="cpu")
        learner = refed.make_learner(c["method"], partial(MLPHead, f.dim, len(f.classes)), config,
                                     num_classes=len(f.classes), memory=c["memory"], progress=progress,
                                     **({"pim_epochs": c["pim-epochs"]} if c["method"].startswith("refed") else {}))
        learner, out = self._run_incremental(learner, progress)
        out.arrays.update({f"state.{k}": v.numpy() for k, v in learner.model.state_dict().items()})
        out.summary["cache_sizes"] = [log["cached"].tolist() for log in learner.memory_log]
        return out


class _Staged:
    """An incremental learner whose stage t announces data key t to the task (and its transport)."""

    def __init__(self, learner, task: Task):
        self._learner, self._task = learner, task

    def learn_task(self, t: int, clients, num_seen: int):
        self._task.stage = t
        return self._learner.learn_task(t, clients, num_seen)

    def __getattr__(self, name):
        return getattr(self._learner, name)


def _feddl_defaults(feddl, **given) -> dict:
    params = inspect.signature(feddl).parameters
    out = {n: p.default for n, p in params.items() if p.default is not inspect.Parameter.empty and n != "progress"}
    out.pop("n_landmarks", None)
    out.update(given)
    return out


def _cost(cost) -> dict:
    return {"fedlib_bytes_up": int(cost.bytes_up), "fedlib_bytes_down": int(cost.bytes_down), "seconds": cost.seconds}
