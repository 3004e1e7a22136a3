"""How the user runs this CLI, for the commands it prints them to run (hints, answers, what
to do next): ``scripts/install.sh`` installs ``dispatch`` into ``.venv/bin``, which is not on
``PATH``, so a bare ``dispatch ...`` hint would not run as printed.

The rule is pip's (its "To update, run: ..." names the invocation that runs this pip):

* run as the ``dispatch`` script (or a symbolic link to it by any name): ``dispatch`` when
  the ``dispatch`` that ``PATH`` finds is this very file, else the path it was invoked by,
  as typed (``.venv/bin/dispatch``, ``./dsp``, or absolute: it runs from where the user
  typed it);
* run as ``python -m dispatch_cli``: that, with this interpreter's absolute path;
* anything else (the SDK inside a user's program, a test calling ``main`` in-process):
  ``dispatch``, the command's name.

Help and usage text keep the name ``dispatch`` (as git's usage says ``git``); shell
completion depends on that name.
"""

from __future__ import annotations

import functools
import os
import shlex
import shutil
import sys
from pathlib import Path
from typing import Final

__all__ = ["NAME", "invocation", "program"]

NAME: Final = "dispatch"
"""The command's name (``[project.scripts]``)."""


def invocation(argv0: str, executable: str, path: str | None) -> str:
    """The command that runs this CLI, as a shell word sequence (module docstring).

    Args:
        argv0: ``sys.argv[0]`` of this process.
        executable: ``sys.executable``.
        path: the ``PATH`` the user's shell searches (None: unset).
    """
    if not argv0:
        return NAME
    if NAME in (Path(argv0).name, Path(os.path.realpath(argv0)).name):
        # the script, or a link to it under another name (`ln -s .venv/bin/dispatch dsp`):
        # a bare `dispatch` would not run where the link does
        found = shutil.which(NAME, path=path)
        if found is not None and _same(found, argv0):
            return NAME
        return shlex.quote(argv0)
    main = Path(argv0)
    if main.name == "__main__.py" and main.parent.name == "dispatch_cli":
        return f"{shlex.quote(executable)} -m dispatch_cli"
    return NAME


@functools.cache
def program() -> str:
    """The command that runs this CLI in this process (:func:`invocation` of its argv[0]);
    hints print ``f"{program()} status JOB"``."""
    return invocation(sys.argv[0] if sys.argv else "", sys.executable, os.environ.get("PATH"))


def _same(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False
