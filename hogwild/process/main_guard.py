"""The `if __name__ == '__main__':` guard that spawn and forkserver need.

spawn and forkserver workers re-import the script that started the run (as `__mp_main__`)
before they run anything: a script that calls `Trainer.fit()` outside an
`if __name__ == '__main__':` guard would train again in every worker. `unguarded_main` tells
the orchestrator so before it starts anything, when it can read it from the script; a worker
that re-runs such a script anyway refuses in `Trainer.fit` (`bootstrapping`) and exits with
`UNGUARDED_EXIT`, which the supervisor (hogwild.run.supervisor) turns into that one line.
"""

from __future__ import annotations

import ast
import multiprocessing
import os
import sys

WORKER_NAME = "hogwild-worker-"  # + rank: the name a spawned child has before its import
# How a worker that found itself re-running an unguarded script exits (`refuse_in_worker`); the
# supervisor reports it as UNGUARDED (errors.WorkerFailure.restartable: a new one would too).
UNGUARDED_EXIT = 86
UNGUARDED_KIND = "unguarded"
UNGUARDED = (
    "the script that calls Trainer.fit(){script} has no `if __name__ == '__main__':` guard: "
    "spawn and forkserver workers re-import it "
    "(https://docs.python.org/3/library/multiprocessing.html"
    "#the-spawn-and-forkserver-start-methods)"
)


def unguarded_message() -> str:
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    return UNGUARDED.format(script=f" ({path})" if path else "")


def bootstrapping() -> bool:
    """Whether this process is a spawn or forkserver child still importing its parent's script
    (multiprocessing's own test, in spawn._check_not_importing_main): a `Trainer.fit` called now
    comes from an unguarded script, and would start a second run inside a worker."""
    return bool(getattr(multiprocessing.current_process(), "_inheriting", False))


def refuse_in_worker() -> None:
    """In a child re-running an unguarded script: a hogwild worker exits at once, without a
    word, before anything is claimed or written (its orchestrator says the one line); any other
    child says it itself."""
    if multiprocessing.current_process().name.startswith(WORKER_NAME):
        sys.stdout.flush()
        sys.stderr.flush()
        # not SystemExit: a forkserver child turns any exception into exit code 1
        os._exit(UNGUARDED_EXIT)
    raise SystemExit(f"hogwild: error: {unguarded_message()}")


def unguarded_main(start_method: str) -> bool:
    """Whether the workers of `start_method` would run this `Trainer.fit` call again: it is
    called from the top level of a script that spawn and forkserver re-import, and no `if`
    around it (or before it, on `__name__`) could keep a worker from reaching it. False
    whenever it cannot tell (no source, a call from a function or a thread, fork): the
    workers' own refusal is the backstop."""
    if start_method == "fork":
        return False
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    spec = getattr(main, "__spec__", None)
    if main is None or not path or (spec is not None and spec.name.endswith(".__main__")):
        return False  # an interactive session, -c, or a package's __main__: not re-imported
    frame = sys._getframe(1)
    while frame is not None and not (
        frame.f_globals is vars(main) and frame.f_code.co_name == "<module>"
    ):
        frame = frame.f_back
    if frame is None:
        return False
    try:
        with open(frame.f_code.co_filename, encoding="utf-8") as f:
            tree = ast.parse(f.read())
    except (OSError, SyntaxError, ValueError):
        return False
    line = frame.f_lineno
    for statement in tree.body:
        if statement.lineno > line:
            break
        inside = statement.lineno <= line <= (statement.end_lineno or statement.lineno)
        if inside:  # the statement that called us: unguarded unless an `if` encloses the call
            return not any(
                isinstance(node, ast.If | ast.Match | ast.While)
                and node.lineno <= line <= (node.end_lineno or node.lineno)
                for node in ast.walk(statement)
            )
        if _exits_on_name(statement):
            return False  # `if __name__ != '__main__': sys.exit()` before the call: a guard
    return False


def _exits_on_name(statement: ast.stmt) -> bool:
    """`if <a test on __name__>: ... raise / exit(...) ...`"""
    if not isinstance(statement, ast.If) or not any(
        isinstance(n, ast.Name) and n.id == "__name__" for n in ast.walk(statement.test)
    ):
        return False
    for node in ast.walk(statement):
        if isinstance(node, ast.Raise):
            return True
        if isinstance(node, ast.Call):
            f = node.func
            name = (
                f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""
            )
            if name in ("exit", "quit", "_exit"):
                return True
    return False
