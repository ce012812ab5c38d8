"""Start the app: ``python -m ui.serve [streamlit options]`` = ``streamlit run app.py [options]``,
minus Streamlit's legacy scan of the ``pages/`` folder (see :mod:`ui.streamlit_compat`).

It also caps uploads at the server (``--server.maxUploadSize``, unless the command line gives
one) at the app's own cap (:func:`ui.workshop.upload_cap_mb`: 64 MB, 16 MB in workshop mode,
or ``PAGEDKV_MAX_UPLOAD_MB``), so the upload box states the limit the app keeps. In workshop mode
(``PAGEDKV_WORKSHOP=1``, which ``make app WORKSHOP=1`` sets; see :mod:`ui.workshop`) it sets the
smaller per-session memory budget, after checking the workshop's environment: a bad value stops
it with one line and exit code 2, before Streamlit starts. It first starts itself again with glibc's
allocator (:data:`MALLOC_ENV`), so that closed sessions' memory goes back to the system.
"""
import os
import sys
from pathlib import Path

from ui.streamlit_compat import use_navigation_only


def workshop_options(argv: list[str]) -> list[str]:
    """The Streamlit options the PAGEDKV_* environment adds to ``argv``: the upload cap, unless
    ``argv`` sets one. Applies the workshop's memory default first. Raises ConfigError (one
    line) for a bad PAGEDKV_* value."""
    from pagedkv_core.sizing.memory import session_budget
    from ui import workshop

    workshop.max_model_sessions()  # parsed now, so a bad value stops the launch rather than a page
    workshop.apply_defaults()
    session_budget()
    cap = workshop.upload_cap_mb()
    return [] if _given(argv, "server.maxUploadSize") else [f"--server.maxUploadSize={cap}"]


def _given(argv: list[str], option: str) -> bool:
    flag = f"--{option}"
    return any(a == flag or a.startswith(flag + "=") for a in argv)


# The server allocates through glibc's malloc, not Python's own small-object allocator. A
# classroom's sessions leave a few long-lived objects (rebuilt snapshots, the server's bookkeeping)
# in nearly every 1 MiB block that Python's allocator took while they played, and it returns a
# block only once it is wholly empty: after 20 sessions at once had gone, Python's live objects
# were as before (71.5 MiB, then 70.9) and the process 37-42 MiB larger. glibc's malloc_trim,
# which the session janitor calls, returns every free page: 28-33 MiB then stayed. It costs about
# 12% of a page's script time (a full run of Reserve or page, 74 -> 84 ms). A value set wins.
MALLOC_ENV = {"PYTHONMALLOC": "malloc", "MALLOC_ARENA_MAX": "2"}


def allocator_env(environ) -> dict[str, str] | None:
    """The environment to start this process again in so that it allocates as :data:`MALLOC_ENV`
    says, or None when ``environ`` already names each (the user's choice wins)."""
    missing = {k: v for k, v in MALLOC_ENV.items() if k not in environ}
    return {**environ, **missing} if missing else None


def main() -> None:
    env = allocator_env(os.environ)
    if env is not None:  # the allocator is chosen at start-up: the same command again, same process id
        os.execve(sys.executable, sys.orig_argv, env)

    from streamlit.web import cli

    from pagedkv_core.config import ConfigError

    args = sys.argv[1:]
    try:
        extra = workshop_options(args)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
    use_navigation_only()
    app = str(Path(__file__).resolve().parents[1] / "app.py")
    sys.argv = ["streamlit", "run", app, *extra, *args]
    sys.exit(cli.main())


if __name__ == "__main__":
    main()
