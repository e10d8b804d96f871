"""Hydra's composition errors, said in one line each (part of the CLI: hogwild.cli.main calls it).

    trainer.num_wokers=3    ->  trainer.num_wokers is not a config key; did you mean trainer.num_workers?
    data=imagenet           ->  data=imagenet is not an option of data (digits, mnist, ...)
    a broken YAML file      ->  <file>, line 2, column 15: while parsing ...; expected ',' or ']' ...

Everything else is not a mistake in the user's input but a bug, and keeps its traceback.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterator, Mapping
from typing import Any


def describe(e: BaseException, overrides: list[str], config_dir: str) -> str | None:
    """The one line for a composition error, or None when `e` is not one."""
    from hydra.errors import (
        ConfigCompositionException,
        MissingConfigException,
        OverrideParseException,
    )
    from omegaconf.errors import OmegaConfBaseException

    yaml_error = _yaml_error(e)
    if yaml_error is not None:
        return yaml_error
    if isinstance(e, MissingConfigException):
        return _missing_option(e, overrides)
    if isinstance(e, OverrideParseException):
        return f"cannot read the override {e.override!r}: {e.message.splitlines()[0]} (Hydra's override syntax: https://hydra.cc/docs/advanced/override_grammar/basic/)"
    if isinstance(e, ConfigCompositionException):
        match = re.match(r"Could not override '([^']+)'", str(e))
        if match:
            return _unknown_key(match.group(1), overrides, config_dir)
        return _first_line(e)
    if isinstance(e, OmegaConfBaseException):
        return _first_line(e)
    return None


def _first_line(e: BaseException) -> str:
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    return lines[0] if lines else type(e).__name__


def _yaml_error(e: BaseException) -> str | None:
    """A YAML syntax error anywhere in the exception's chain: the file, line and problem."""
    import yaml

    seen: set[int] = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, yaml.MarkedYAMLError) and (e.context_mark or e.problem_mark):
            mark = e.context_mark or e.problem_mark  # where the broken construct begins
            what = "; ".join(p for p in (e.context, e.problem) if p)
            return f"{mark.name}, line {mark.line + 1}, column {mark.column + 1}: {what}"
        e = e.__cause__ or e.__context__
    return None


def _missing_option(e, overrides: list[str]) -> str:
    group, _, name = (e.missing_cfg_file or "").rpartition("/")
    if not group:
        return _first_line(e)
    options = sorted(o for o in (e.options or []) if not o.startswith("_"))
    said = f"{group}={name} is not an option of {group}"
    if not options:
        return f"{said} (no options found for {group!r})"
    return f"{said} (allowed: {', '.join(options)}){_did_you_mean(name, options)}"


def _unknown_key(key: str, overrides: list[str], config_dir: str) -> str:
    depth = key.count(".")
    keys = [k for k in _config_keys(overrides, config_dir) if k.count(".") == depth]
    hint = _did_you_mean(key, keys)
    if not hint:
        hint = f"; to add a new key use +{key}=..."
    return f"{key} is not a config key{hint}"


def _did_you_mean(word: str, candidates: list[str]) -> str:
    close = difflib.get_close_matches(word, candidates, n=1, cutoff=0.6)
    return f"; did you mean {close[0]}?" if close else ""


def _config_keys(overrides: list[str], config_dir: str) -> list[str]:
    """Every dotted key of the config these group choices compose (the error path only)."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from omegaconf import OmegaConf

    groups = [
        o
        for o in overrides
        if "=" in o and "." not in o.split("=")[0] and not o.startswith(("hydra", "~", "-"))
    ]
    for attempt in (groups, []):
        GlobalHydra.instance().clear()
        try:
            with initialize_config_dir(config_dir=config_dir, version_base="1.3"):
                cfg = compose("train", overrides=attempt)
            return list(_flatten(OmegaConf.to_container(cfg, resolve=False)))
        except Exception:  # noqa: BLE001 - one of the choices is itself wrong: try without
            continue
        finally:
            GlobalHydra.instance().clear()
    return []


def _flatten(node: Mapping[str, Any], prefix: str = "") -> Iterator[str]:
    for key, value in node.items():
        path = f"{prefix}{key}"
        yield path
        if isinstance(value, Mapping):
            yield from _flatten(value, path + ".")
