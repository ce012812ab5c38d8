"""Start the app: ``python -m pages.serve [streamlit options]`` = ``streamlit run app.py [options]``.

The pages live in ``pages/`` as the product card asks, but Streamlit also treats a ``pages/``
folder beside the main script as a legacy multipage app until ``st.navigation`` has run once. The
very first request of a fresh server would then run a page script on its own (without the shared
sidebar) or flash "Page not found" for a deep link. Telling Streamlit up front that this app uses
``st.navigation`` makes the first request behave like every later one.
"""
import sys
from pathlib import Path


def main() -> None:
    from streamlit.runtime.pages_manager import PagesManager
    from streamlit.web import cli

    PagesManager.uses_pages_directory = False
    app = str(Path(__file__).resolve().parents[1] / "app.py")
    sys.argv = ["streamlit", "run", app, *sys.argv[1:]]
    sys.exit(cli.main())


if __name__ == "__main__":
    main()
