"""Resume is one command: a run continued with `resume_from` gets the config it ran with.

    hogwild train hydra.run.dir=runs/a trainer.epochs=2       # Ctrl-C
    hogwild train hydra.run.dir=runs/a resume_from=auto       # 2 epochs, as the run had
    hogwild train hydra.run.dir=runs/a resume_from=auto trainer.epochs=4   # changed: 2 -> 4

The run being continued wrote its overrides to `.hydra/overrides.yaml` (hogwild.cli.job): they
are composed again, and the overrides given now apply after them (a key given now replaces
the run's own). The job then logs what differs from the run's `.hydra/config.yaml`. A folder
without `.hydra/` (a Python API run) resumes with what is given now, as before.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Resumed:
    folder: Path  # the run being continued
    own: list[str]  # its overrides that still apply (those given now replace the rest)
    overrides: list[str]  # what is composed: `own`, then what was given now


def override_key(override: str) -> str:
    """`+experiment=mnist` -> `experiment`: the key an override sets (or removes)."""
    return override.split("=", 1)[0].lstrip("+~")


def _value(overrides: list[str], key: str) -> str | None:
    """The value given last for `key`, unquoted as Hydra reads it (`'runs/my run'`)."""
    values = [o.split("=", 1)[1] for o in overrides if "=" in o and override_key(o) == key]
    if not values:
        return None
    from hydra.core.override_parser.overrides_parser import OverridesParser

    value = values[-1]
    try:  # Hydra's own reading: quotes and their escapes undone exactly as it undoes them
        parsed = OverridesParser.create().parse_override(f"{key}={value}").value()
        return parsed if isinstance(parsed, str) else value
    except Exception:  # noqa: BLE001 - not Hydra's grammar: composing will say so
        return value


def continued_folder(overrides: list[str]) -> Path | None:
    """The run folder `resume_from` continues: `hydra.run.dir` for `auto`, the run holding the
    checkpoint for a path (<run>/checkpoints/last.pt); None when there is none to read."""
    resume = _value(overrides, "resume_from")
    if resume in (None, "", "null", "None"):
        return None
    if resume == "auto":
        folder = _value(overrides, "hydra.run.dir")
        return Path(folder) if folder else None
    checkpoint = Path(resume)
    return checkpoint.parent.parent if checkpoint.parent.name == "checkpoints" else None


def with_own_overrides(overrides: list[str]) -> Resumed | None:
    """The overrides to compose for a resume: the continued run's own first (its `hydra.*` and
    `resume_from` aside), then those given now, which win key by key. None: not a resume, a
    sweep, or no `.hydra/overrides.yaml` to read (then nothing changes)."""
    import yaml

    if any(o in ("-m", "--multirun") for o in overrides):
        return None
    folder = continued_folder(overrides)
    if folder is None:
        return None
    try:
        saved = yaml.safe_load((folder / ".hydra" / "overrides.yaml").read_text())
    except (OSError, yaml.YAMLError):
        return None
    if not isinstance(saved, list) or not all(isinstance(o, str) for o in saved):
        return None
    saved = [
        o
        for o in saved
        if not override_key(o).startswith("hydra.") and override_key(o) != "resume_from"
    ]
    given = {override_key(o) for o in overrides if "=" in o or o.startswith("~")}
    # Hydra lets a later `key=value` replace an earlier one (and `~key` remove it), but refuses
    # a key added twice (`+experiment=a +experiment=b`) and a value for a key removed before
    added_now = {override_key(o) for o in overrides if o.startswith("+")}
    valued_now = {override_key(o) for o in overrides if "=" in o}
    # another choice of a group now (data=digits after data=synthetic): the run's values inside
    # it (data.seed=3) belonged to the old choice; the same choice again keeps them
    changed_groups = {k for k in given if "." not in k and _value(overrides, k) != _value(saved, k)}
    saved = [
        o
        for o in saved
        if "." not in override_key(o) or override_key(o).split(".", 1)[0] not in changed_groups
    ]
    kept = [
        o
        for o in saved
        if not (o.startswith("+") and override_key(o) in added_now)
        and not (o.startswith("~") and override_key(o) in valued_now)
    ]
    own = [o for o in saved if override_key(o) not in given]
    own = [
        o
        for i, o in enumerate(own)
        if override_key(o) not in {override_key(p) for p in own[i + 1 :]}
    ]
    # before the first override given now, after the options before it (`--config-dir X`):
    # Hydra's argparse takes the overrides only as one unbroken run of words
    first = next((i for i, o in enumerate(overrides) if "=" in o and not o.startswith("-")), 0)
    return Resumed(folder, own, [*overrides[:first], *kept, *overrides[first:]])


def changes(folder: Path, now: dict[str, Any]) -> list[str]:
    """`key was -> now` for every value of the composed config (unresolved) that differs from
    the continued run's `.hydra/config.yaml`; `resume_from` and Hydra's choices aside."""
    import yaml

    try:
        was = yaml.safe_load((folder / ".hydra" / "config.yaml").read_text())
    except (OSError, yaml.YAMLError):
        return []
    if not isinstance(was, dict):
        return []
    before, after = dict(_flat(was)), dict(_flat(now))
    return [
        f"{key} {_said(before.get(key))} -> {_said(after.get(key))}"
        for key in sorted(before.keys() | after.keys())
        if key != "resume_from"
        and (key in before, before.get(key)) != (key in after, after.get(key))
    ]


def _said(value: Any) -> str:
    return "(none)" if value is None else str(value)


def _flat(values: dict[str, Any], prefix: str = ""):
    for key, value in values.items():
        if isinstance(value, dict) and value:
            yield from _flat(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", value


def command(folder: str, config_dir: str | None = None) -> str:
    """What a user types to continue the run in `folder` (its own overrides come back; a
    `--config-dir` is not an override, so it is given again). A folder with characters that
    Hydra's grammar reads only quoted (`=`, `,`, a space) is quoted for Hydra, then the shell."""
    extra = f"--config-dir {shlex.quote(config_dir)} " if config_dir else ""
    if re.search(r"[^A-Za-z0-9_./-]", folder):
        # Hydra's quoted strings: a backslash is doubled only before a quote (or the end)
        escaped = re.sub(r"(\\+)(?='|$)", r"\1\1", folder).replace("'", "\\'")
        folder = f"'{escaped}'"
    where = f"hydra.run.dir={folder}"
    # for the shell: in double quotes when nothing in it is special there (Hydra's own single
    # quotes then read as they are typed), else shlex's quoting
    if shlex.quote(where) != where and re.fullmatch(r"[^\"$`\\!]*", where):
        where = f'"{where}"'
    else:
        where = shlex.quote(where)
    return f"python -m hogwild train {extra}{where} resume_from=auto"


def config_dir_given(sources: list[dict[str, Any]]) -> str | None:
    """The `--config-dir` of a run, from Hydra's runtime.config_sources (its provider is
    `command-line`)."""
    for source in sources:
        if source.get("provider") == "command-line" and source.get("schema") == "file":
            return str(source.get("path")) or None
    return None
