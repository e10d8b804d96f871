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
