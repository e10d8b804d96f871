"""Hydra's composition errors, said in one line each (part of the CLI: hogwild.cli.main calls it).

    trainer.num_wokers=3    ->  trainer.num_wokers is not a config key; did you mean trainer.num_workers?
    data=imagenet           ->  data=imagenet is not an option of data (digits, mnist, ...)
    a broken YAML file      ->  <file>, line 2, column 15: while parsing ...; expected ',' or ']' ...
    hydra.run.dir=runs/é    ->  cannot read the override ...; quote the value ...: 'hydra.run.dir="runs/é"'
    a read-only run folder  ->  cannot write runs/a: Read-only file system; choose a writable ...

Everything else is not a mistake in the user's input but a bug, and keeps its traceback.
"""

from __future__ import annotations

import difflib
import os
import re
import shlex
from collections.abc import Iterator, Mapping
from typing import Any


def describe(e: BaseException, overrides: list[str], config_dir: str) -> str | None:
    """The one line for a composition error, or None when `e` is not one."""
    from hydra.errors import (
        ConfigCompositionException,
        HydraException,
        MissingConfigException,
        OverrideParseException,
        SearchPathException,
    )
    from omegaconf.errors import OmegaConfBaseException

    yaml_error = _yaml_error(e)
    if yaml_error is not None:
        return yaml_error
    if isinstance(e, MissingConfigException):
        return _missing_option(e, overrides)
    if isinstance(e, OverrideParseException):
        return _unreadable_override(e.override, e.message.splitlines()[0])
    if isinstance(e, ConfigCompositionException):
        match = re.match(r"Could not override '([^']+)'", str(e))
        if match:
            return _unknown_key(match.group(1), overrides, config_dir)
        return _first_line(e)
    if isinstance(e, OmegaConfBaseException):
        return _first_line(e)
    if isinstance(e, SearchPathException):  # --config-dir / -cd: a folder that is not there
        match = re.search(r"directory '([^']*)' not found", str(e))
        folder = match.group(1) if match else _first_line(e)
        return f"--config-dir {folder}: no such folder (give a folder of YAML config groups)"
    if isinstance(e, HydraException):  # what Hydra refuses of the command (a sweep it cannot run)
        return _first_line(e)
    return None


def folder_error(path: str, e: OSError, key: str) -> str:
    """A run folder that cannot be made or written (read-only, no permission, no space): the
    folder, the OS reason, and the key that points the run elsewhere (`hydra.run.dir`, or
    `hydra.sweep.dir` for a sweep). For Hydra's own mkdir, and for hogwild.cli.job's check of a
    folder that exists."""
    reason = os.strerror(e.errno) if e.errno else str(e)
    return f"cannot write {path}: {reason}; choose a writable run folder with {key}=<folder>"


def _unreadable_override(override: str, problem: str) -> str:
    """An override Hydra's grammar refuses. A value with characters the grammar does not take
    unquoted (`runs/é`, `a(b)`) is read once quoted for Hydra, inside the shell's quotes: the
    line then says exactly what to type."""
    said = f"cannot read the override {override!r}: {problem}"
    syntax = "(Hydra's override syntax: https://hydra.cc/docs/advanced/override_grammar/basic/)"
    hint = _quoted(override)
    return f"{said}; quote the value, as in {hint} {syntax}" if hint else f"{said} {syntax}"


def _quoted(override: str) -> str | None:
    """`key=value` with the value in Hydra's quotes and the whole in the shell's, when Hydra
    then reads the same value back; None when quoting is not the fix (a sweep `a=1,é`, a
    value that is already quoted, no `=`)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    key, sep, value = override.partition("=")
    if not sep or not value or "," in value or value[0] in "'\"" or value[-1] in "'\"":
        return None
    quote = next((q for q in "\"'" if q not in value and "\\" not in value), None)
    if quote is None:
        return None
    candidate = f"{key}={quote}{value}{quote}"
    try:
        parsed = OverridesParser.create().parse_override(candidate)
    except Exception:  # noqa: BLE001 - quoting does not help: no hint
        return None
    return shlex.quote(candidate) if parsed.value() == value else None


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
