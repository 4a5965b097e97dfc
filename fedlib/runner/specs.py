"""The chapters' parameter checks, run by the runner before anything executes: :func:`check` finds a
chapter's :class:`~fedlib.core.specs.Spec` in its paper's folder (``fedlib.afl.specs`` ...) and raises a
ValueError naming the parameter and what is allowed. The notebooks hold no checking code (they call
``check(NAME, globals())`` once, for readers who edit the parameters cell by hand).
"""
from __future__ import annotations

from typing import Any, Mapping

from fedlib.afl import specs as afl_specs
from fedlib.core import validate
from fedlib.core.specs import COMMON, Spec
from fedlib.fedtsne import specs as fedtsne_specs
from fedlib.refed import specs as refed_specs
from fedlib.stsa import specs as stsa_specs

SPECS: dict[str, Spec] = {**afl_specs.SPECS, **stsa_specs.SPECS, **fedtsne_specs.SPECS, **refed_specs.SPECS}


def spec(chapter: str) -> Spec:
    """The :class:`~fedlib.core.specs.Spec` of ``chapter``."""
    validate.check_choice("chapter", chapter, SPECS)
    return SPECS[chapter]


def check(chapter: str, values: Mapping[str, Any]) -> dict[str, Any]:
    """Check ``chapter``'s parameters found in ``values`` (a dict or a notebook's ``globals()``).

    Returns the checked values; raises ValueError naming the parameter and what is allowed.
    """
    s = spec(chapter)
    known = {name: values[name] for name in {**COMMON, **s.params} if name in values}
    missing = sorted(set(s.params) - set(known) - set(COMMON))
    if missing:
        raise ValueError(f"{chapter}: parameter(s) {', '.join(missing)} not given")
    return s.check(known)
