"""Value checks for config fields: each one says what it allows, and refuses anything else with
one line that names the key, the value and what is allowed.

A field declares its check next to its default and its doc (`config.option`), so validation,
the docs (docs/configuration.md) and the error messages all read the same rule.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
from collections.abc import Callable, Sequence
from typing import Any

from hogwild.errors import ConfigError


def refuse(key: str, value: Any, allowed: str) -> ConfigError:
    return ConfigError(f"{key}={value!r} is not valid: {allowed}")


def unknown_key(section: str, key: str, value: Any, known: Sequence[str]) -> ConfigError:
    """'did you mean' for a misspelt key, then every key that is allowed."""
    close = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
    hint = f"; did you mean {section + '.' if section else ''}{close[0]}?" if close else ""
    where = f"{section}.{key}" if section else key
    return ConfigError(
        f"{where}={value!r}: {key!r} is not a known key{hint} (allowed: {', '.join(known)})"
    )


@dataclasses.dataclass(frozen=True)
class Int:
    minimum: int
    auto: str | None = None  # what `auto` means, when the field takes it

    def __call__(self, key: str, value: Any) -> int | str:
        if value == "auto" and self.auto:
            return value
        if isinstance(value, bool) or not isinstance(value, int) or value < self.minimum:
            raise refuse(key, value, "expected " + self.allowed())
        return value

    def allowed(self) -> str:
        return f"an integer >= {self.minimum}" + (f" or 'auto' ({self.auto})" if self.auto else "")


@dataclasses.dataclass(frozen=True)
class Number:
    minimum: float
    below: float | None = None  # exclusive upper bound
    maximum: float | None = None  # inclusive upper bound

    def __call__(self, key: str, value: Any) -> float:
        ok = (
            not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)
        )
        ok = ok and value >= self.minimum
        ok = (
            ok
            and (self.below is None or value < self.below)
            and (self.maximum is None or value <= self.maximum)
        )
        if not ok:
            raise refuse(key, value, "expected " + self.allowed())
        return float(value)

    def allowed(self) -> str:
        upper = f" and < {self.below}" if self.below is not None else ""
        upper += f" and <= {self.maximum}" if self.maximum is not None else ""
        lower = f" >= {self.minimum}" if self.minimum > -math.inf else ""
        return f"a finite number{lower}{upper}"


@dataclasses.dataclass(frozen=True)
class OrNull:
    """`null` (what it means, e.g. "the environment's reward threshold") or what `check` allows."""

    check: Any
    means: str

    def __call__(self, key: str, value: Any) -> Any:
        return None if value is None else self.check(key, value)

    def allowed(self) -> str:
        return f"{self.check.allowed()} or null ({self.means})"


@dataclasses.dataclass(frozen=True)
class Choice:
    values: tuple[str, ...] | Callable[[], tuple[str, ...]]
    words: bool = (
        False  # YAML reads `true`/`false` as booleans; a choice among words wants them back
    )

    def options(self) -> tuple[str, ...]:
        return self.values() if callable(self.values) else self.values

    def __call__(self, key: str, value: Any) -> str:
        if self.words and isinstance(value, bool):
            value = "true" if value else "false"
        if value not in self.options():
            raise refuse(key, value, "allowed: " + ", ".join(self.options()))
        return value

    def allowed(self) -> str:
        return " | ".join(self.options())


@dataclasses.dataclass(frozen=True)
class Bool:
    def __call__(self, key: str, value: Any) -> bool:
        if not isinstance(value, bool):
            raise refuse(key, value, "expected true or false")
        return value

    def allowed(self) -> str:
        return "true | false"


@dataclasses.dataclass(frozen=True)
class Device:
    def __call__(self, key: str, value: Any) -> str:
        ok = isinstance(value, str) and (
            value in ("cpu", "cuda") or (value.startswith("cuda:") and value[5:].isdigit())
        )
        if not ok:
            raise refuse(key, value, "allowed: cpu, cuda, cuda:N")
        return value

    def allowed(self) -> str:
        return "cpu | cuda | cuda:N"


def check_fields(section: str, values: Any, cls: type) -> dict[str, Any]:
    """The values of a `cls` dataclass section, each checked by its field's check; a key that
    is not a field is refused with the closest one."""
    fields = {f.name: f for f in dataclasses.fields(cls)}
    merged = {name: f.default for name, f in fields.items()}
    for key, value in dict(values).items():
        if key not in fields:
            raise unknown_key(section, key, value, list(fields))
        merged[key] = value
    return {
        name: fields[name].metadata["check"](f"{section}.{name}", value)
        for name, value in merged.items()
    }


def check_arguments(section: str, values: dict[str, Any], target: Callable, supplied=()) -> None:
    """A `_target_` section against what its target takes (a class's `__init__`, a function):
    a key it has no parameter for is refused with the closest one, and a value that does not
    match a plain annotation (int, float, bool, str, a sequence of them, Optional) names the key,
    the value and the type, before the target is called with it. `supplied`: the arguments the
    framework passes itself (a model's input_shape, ...). Whatever cannot be read is left to
    the call."""
    import inspect
    import typing

    try:
        parameters = inspect.signature(target).parameters
    except (TypeError, ValueError):  # a builtin without a signature
        return
    named = [
        name
        for name, p in parameters.items()
        if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and name not in supplied
    ]
    takes_any = any(p.kind is p.VAR_KEYWORD for p in parameters.values())
    given = {k: v for k, v in values.items() if not k.startswith("_")}
    for key, value in given.items():
        if key not in parameters and not takes_any:
            raise unknown_key(section, key, value, [n for n in named if n != "params"])
    try:
        init = target.__init__ if isinstance(target, type) else target
        hints = typing.get_type_hints(init)
    except (NameError, TypeError, AttributeError, SyntaxError):  # the call says what is wrong
        return
    for key, value in given.items():
        hint = hints.get(key)
        if value is None and getattr(parameters.get(key), "default", 0) is None:
            continue  # `x: int = None`: None is what it takes by default
        if hint is not None and _matches(value, hint) is False:
            whose = f"the {key} of {target.__module__}.{target.__qualname__}"
            yaml = any(isinstance(v, str) and "- " in v for v in _items(value))
            hint_line = "; a YAML list has one '- item' per line, all at one indentation"
            raise refuse(
                f"{section}.{key}",
                value,
                f"expected {_spoken(hint)} ({whose}){hint_line if yaml else ''}",
            ) from None


def _items(value: Any) -> list[Any]:
    return list(value) if isinstance(value, list | tuple) else [value]


def _matches(value: Any, hint: Any) -> bool | None:
    """Whether `value` (from YAML) fits `hint`; None when the hint is beyond these plain cases."""
    import types
    import typing
    from collections.abc import Sequence as AbstractSequence

    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is Any:
        return True
    if hint is type(None):
        return value is None
    if origin in (typing.Union, types.UnionType):
        fits = [_matches(value, a) for a in args]
        return True if any(fits) else (None if None in fits else False)
    if hint is bool:  # 0 and 1 too: Python takes them as false and true
        return isinstance(value, bool) or value in (0, 1)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if hint is str:  # a number where a string is meant (`id: 123`) is the call's to judge
        return isinstance(value, str) or None
    if origin in (list, tuple, AbstractSequence, typing.Sequence) or hint in (list, tuple):
        if not isinstance(value, list | tuple):
            return False
        items = [a for a in args if a is not Ellipsis]
        if len(items) != 1:
            return None if items else True
        fits = [_matches(v, items[0]) for v in value]
        return False if False in fits else (None if None in fits else True)
    return None


def _spoken(hint: Any) -> str:
    """`Sequence[int]` -> 'a list of integers', for the refusal's line."""
    import typing

    names = {int: "an integer", float: "a number", bool: "true or false", str: "a string"}
    plural = {int: "integers", float: "numbers", bool: "booleans", str: "strings"}
    if hint in names:
        return names[hint]
    args = [a for a in typing.get_args(hint) if a is not Ellipsis]
    if hint is type(None):
        return "null"
    if typing.get_origin(hint) in (typing.Union, __import__("types").UnionType):
        return " or ".join(_spoken(a) for a in args)
    if len(args) == 1 and args[0] in plural:
        return f"a list of {plural[args[0]]}"
    return getattr(hint, "__name__", str(hint))
