"""Client programs as data: what the server tells a node to run, and the node building it from its own code.

No code crosses the wire. The server describes each client program it hands to ``simulate`` as a
JSON object (:func:`describe`): the program's registered name (:data:`PROGRAMS`) and its settings
(numbers, strings, lists; a gradient method by its registry name and hyperparameters, a replay policy
by its class name among :data:`REPLAYS` and its settings, a model by the shapes of its state). A node
builds the program from that object with fedlib's own classes (:func:`build`): a name outside the
registries is refused, and the node's model of the run (``task.model()``) must have exactly the
described state. Programs are compared by their description, so the node keeps one per description.
"""
from __future__ import annotations

import dataclasses
import inspect
import json
from typing import Any, Callable

import torch
from torch import nn

from fedlib.afl.algorithm import AFLClient
from fedlib.federated.fcil import METHODS as FCIL_METHODS
from fedlib.federated.fcil import make_method
from fedlib.federated.gradient import ALGORITHMS, FedAlgorithm, FedConfig, GradientClient, make_algorithm
from fedlib.federated.learner import (CacheClient, HerdingReplay, RandomReplay, ReservoirReplay, ScoreReplay,
                                      StageClient, StateInit)
from fedlib.fedtsne.algorithm import FedDLClient, NystromClient
from fedlib.refed.algorithm import RefedReplay
from fedlib.stsa.algorithm import STSAClient

#: dataclass client programs, rebuilt from their public fields
DATACLASSES = {"afl": AFLClient, "stsa": STSAClient, "feddl": FedDLClient, "nystrom": NystromClient}
REPLAYS = {cls.__name__: cls for cls in (RandomReplay, RefedReplay, ScoreReplay, HerdingReplay, ReservoirReplay)}


# ------------------------------------------------------------------------------------------------
# plain values <-> JSON
# ------------------------------------------------------------------------------------------------
def _value(v: Any) -> Any:
    if isinstance(v, torch.dtype):
        return {"torch.dtype": str(v).removeprefix("torch.")}
    if isinstance(v, torch.device):
        return str(v)
    if isinstance(v, tuple):
        return {"tuple": [_value(x) for x in v]}
    if isinstance(v, list):
        return [_value(x) for x in v]
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    raise TypeError(f"a client program setting of type {type(v).__name__} cannot travel as data")


def _restore(v: Any) -> Any:
    if isinstance(v, dict) and set(v) == {"torch.dtype"}:
        dtype = getattr(torch, str(v["torch.dtype"]), None)
        if not isinstance(dtype, torch.dtype):
            raise ValueError(f"unknown torch dtype {v['torch.dtype']!r}")
        return dtype
    if isinstance(v, dict) and set(v) == {"tuple"}:
        return tuple(_restore(x) for x in v["tuple"])
    if isinstance(v, list):
        return [_restore(x) for x in v]
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    raise ValueError(f"malformed client program setting {v!r}")


def _settings(obj, names) -> dict:
    return {n: _value(getattr(obj, n)) for n in names}


def _init_names(cls) -> list[str]:
    return [p for p in inspect.signature(cls.__init__).parameters if p != "self"]


# ------------------------------------------------------------------------------------------------
# the parts of a gradient program
# ------------------------------------------------------------------------------------------------
def _method(method: FedAlgorithm) -> dict:
    registry = "fcil" if type(method) in FCIL_METHODS.values() else "gradient"
    known = FCIL_METHODS if registry == "fcil" else ALGORITHMS
    if known.get(method.name) is not type(method):
        raise TypeError(f"{type(method).__name__} is not a registered method; it cannot run over Flower")
    return {"registry": registry, "name": method.name, "hparams": {k: _value(v) for k, v in method.hparams().items()},
            "aggregation": method.aggregation}


def _make_method(desc: dict) -> FedAlgorithm:
    make = make_method if desc["registry"] == "fcil" else make_algorithm
    method = make(str(desc["name"]), **{k: _restore(v) for k, v in desc["hparams"].items()})
    method.aggregation = str(desc["aggregation"])
    return method


def _model(model: nn.Module) -> dict:
    if isinstance(model, nn.Identity):
        return {"kind": "identity"}
    return {"kind": "task", "state": [[k, list(v.shape), str(v.dtype)] for k, v in model.state_dict().items()],
            "trained": [n for n, p in model.named_parameters() if p.requires_grad]}


def _make_model(desc: dict, task) -> nn.Module:
    if desc["kind"] == "identity":
        return nn.Identity()
    model = task.model()
    state = [[k, list(v.shape), str(v.dtype)] for k, v in model.state_dict().items()]
    if state != desc["state"]:
        raise ValueError("the server's model differs from this node's model of the run (state dict keys, shapes "
                         "or dtypes): both must run the same fedlib version and options")
    trained = set(desc["trained"])
    for n, p in model.named_parameters():
        p.requires_grad_(n in trained)
    return model


def _replay(replay) -> dict:
    if REPLAYS.get(type(replay).__name__) is not type(replay):
        raise TypeError(f"{type(replay).__name__} is not a registered replay policy; it cannot run over Flower")
    return {"class": type(replay).__name__, "settings": _settings(replay, _init_names(type(replay)))}


def _make_replay(desc: dict):
    cls = REPLAYS.get(str(desc["class"]))
    if cls is None:
        raise ValueError(f"unknown replay policy {desc['class']!r}; allowed: {', '.join(REPLAYS)}")
    return cls(**{k: _restore(v) for k, v in desc["settings"].items()})


# ------------------------------------------------------------------------------------------------
# describe / build
# ------------------------------------------------------------------------------------------------
def describe(program) -> str:
    """The JSON description of a client program (TypeError for a program that cannot run over Flower)."""
    for name, cls in DATACLASSES.items():
        if type(program) is cls:
            fields = [f.name for f in dataclasses.fields(cls) if f.init and not f.name.startswith("_")]
            return _dump({"program": name, "settings": _settings(program, fields)})
    if type(program) is GradientClient:
        desc = {"program": "gradient", "method": _method(program.method), "model": _model(program.model),
                "config": _config_settings(program.config), "num_classes": program.num_classes}
    elif type(program) is CacheClient:
        desc = {"program": "cache", "replay": _replay(program.replay), "model": _model(program.global_model),
                "config": _config_settings(program.config), "num_classes": program.num_classes,
                "names": list(program.names)}
    elif type(program) is StageClient:
        desc = {"program": "stage", "method": _method(program.method), "model": _model(program.global_model),
                "config": _config_settings(program.config), "names": list(program.names)}
    elif type(program) is StateInit:
        desc = {"program": "state-init", "method": _method(program.method), "seed": int(program.seed)}
    else:
        raise TypeError(f"{type(program).__name__} is not a client program that can run over Flower "
                        f"(fedlib.flower.programs)")
    return _dump(desc)


def _dump(desc: dict) -> str:
    return json.dumps(desc, sort_keys=True)


def _config_settings(config: FedConfig) -> dict:
    return _settings(config, [f.name for f in dataclasses.fields(FedConfig)])


def _config(settings: dict) -> FedConfig:
    return FedConfig(**{k: _restore(v) for k, v in settings.items()})


BUILDERS: dict[str, Callable[[dict, Any], Any]] = {
    "gradient": lambda d, task: GradientClient(_make_method(d["method"]), _make_model(d["model"], task),
                                               _config(d["config"]), int(d["num_classes"])),
    "cache": lambda d, task: CacheClient(_make_replay(d["replay"]), _make_model(d["model"], task),
                                         _config(d["config"]), int(d["num_classes"]), [str(n) for n in d["names"]]),
    "stage": lambda d, task: StageClient(_make_method(d["method"]), _make_model(d["model"], task),
                                         _config(d["config"]), [str(n) for n in d["names"]]),
    "state-init": lambda d, task: StateInit(_make_method(d["method"]), int(d["seed"])),
}


def build(description: str, task) -> Any:
    """The client program a description names, built from fedlib's own classes on this node (ValueError
    for a program, method or policy outside the registries)."""
    desc = json.loads(description)
    if not isinstance(desc, dict) or "program" not in desc:
        raise ValueError("malformed client program description")
    name = desc["program"]
    if name in DATACLASSES:
        return DATACLASSES[name](**{k: _restore(v) for k, v in desc["settings"].items()})
    if name not in BUILDERS:
        raise ValueError(f"unknown client program {name!r}; allowed: {', '.join([*DATACLASSES, *BUILDERS])}")
    return BUILDERS[name](desc, task)
