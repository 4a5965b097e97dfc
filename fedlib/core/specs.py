"""Typed parameter specifications: the types a chapter's parameters are checked against (:class:`Int`,
:class:`Real`, :class:`Choice`, :class:`List`...) and :class:`Spec`, a chapter's parameters with their
cross-parameter rules. Each paper's chapters have their specs in its folder (``fedlib.afl.specs`` ...);
:mod:`fedlib.runner.specs` finds a chapter's and checks it before anything executes. A bad value fails in
a second with a ValueError naming the parameter and what is allowed, not after minutes of work.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

from fedlib.core import validate


class Param:
    """One parameter's type; ``__call__(name, value)`` returns the checked value or raises."""

    def __call__(self, name: str, value):
        raise NotImplementedError

    def __or__(self, other: "Param") -> "Param":
        return OneOf(self, other)


@dataclass(frozen=True)
class Int(Param):
    minimum: int | None = None
    maximum: int | None = None

    def __call__(self, name, value):
        return validate.check_int(name, value, self.minimum, self.maximum)


@dataclass(frozen=True)
class Real(Param):
    low: float | None = None
    high: float | None = None
    strict: bool = True

    def __call__(self, name, value):
        return validate.check_real(name, value, low=self.low, high=self.high, strict=self.strict)


@dataclass(frozen=True)
class Instance(Param):
    """A value of Python type(s) ``types``, described as ``wording`` in the error."""

    types: type | tuple
    wording: str

    def __call__(self, name, value):
        if not isinstance(value, self.types):
            raise ValueError(f"{name} must be {self.wording}, got {value!r}")
        return value


def Bool() -> Instance:
    return Instance(bool, "true or false")


def Str() -> Instance:
    return Instance(str, "a string")


@dataclass(frozen=True)
class Choice(Param):
    options: tuple

    def __init__(self, options):
        object.__setattr__(self, "options", tuple(options))

    def __call__(self, name, value):
        validate.check_choice(name, value, self.options)
        return value


@dataclass(frozen=True)
class Null(Param):
    def __call__(self, name, value):
        if value is not None:
            raise ValueError(f"{name} must be null, got {value!r}")
        return value


NULL = Null()


@dataclass(frozen=True)
class OneOf(Param):
    """The first alternative that accepts the value; the error lists every alternative's message."""

    alternatives: tuple

    def __init__(self, *alternatives: Param):
        object.__setattr__(self, "alternatives", tuple(alternatives))

    def __call__(self, name, value):
        errors = []
        for alt in self.alternatives:
            try:
                return alt(name, value)
            except ValueError as err:   # "NAME must be X, got V" -> "X"
                errors.append(str(err).removeprefix(f"{name} must be ").rsplit(", got ", 1)[0])
        raise ValueError(f"{name} must be {' or '.join(errors)}, got {value!r}")


@dataclass(frozen=True)
class List(Param):
    """A list of ``item`` values: at least ``least`` of them, optionally distinct or increasing."""

    item: Param
    least: int = 1
    distinct: bool = False
    increasing: bool = False

    def __call__(self, name, value):
        if isinstance(value, (str, bytes, Mapping)) or not isinstance(value, Sequence):
            raise ValueError(f"{name} must be a list, got {value!r}")
        out = [self.item(f"{name}[{i}]", v) for i, v in enumerate(value)]
        if len(out) < self.least:
            raise ValueError(f"{name} must hold at least {self.least} value(s), got {value!r}")
        if self.distinct and len(set(map(repr, out))) != len(out):
            raise ValueError(f"{name} must not repeat a value, got {value!r}")
        if self.increasing and any(b <= a for a, b in zip(out, out[1:])):
            raise ValueError(f"{name} must be strictly increasing, got {value!r}")
        return out


def Seeds(least: int = 1) -> List:
    """Distinct non-negative integer seeds, at least ``least`` of them."""
    return List(Int(0), least=least, distinct=True)


@dataclass(frozen=True)
class Dict(Param):
    """A mapping with keys from ``keys`` (a Choice or Str) and values of type ``value``."""

    keys: Param
    value: Param

    def __call__(self, name, value):
        if not isinstance(value, Mapping):
            raise ValueError(f"{name} must be a mapping, got {value!r}")
        return {self.keys(f"{name} key", k): self.value(f"{name}[{k!r}]", v) for k, v in value.items()}


Rule = Callable[[Mapping[str, Any]], None]
COMMON = {"profile": Choice(("smoke", "quick", "paper"))}   # set by the runner in every chapter


@dataclass
class Spec:
    """A chapter's parameters: ``params`` maps every name of its ``parameters`` cell to a type;
    ``rules`` are cross-parameter checks (each raises ValueError naming the parameters)."""

    params: dict[str, Param]
    rules: list[Rule] = field(default_factory=list)

    def check(self, values: Mapping[str, Any]) -> dict[str, Any]:
        types = {**COMMON, **self.params}
        unknown = sorted(set(values) - set(types))
        if unknown:
            raise ValueError(f"unknown parameter(s) {', '.join(unknown)}; allowed: {', '.join(types)}")
        out = {name: types[name](name, v) for name, v in values.items()}
        for rule in self.rules:
            rule({**values, **out})
        return out
