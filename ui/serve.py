"""Start the app: ``python -m ui.serve [streamlit options]`` = ``streamlit run app.py [options]``,
minus Streamlit's legacy scan of the ``pages/`` folder (see :mod:`ui.streamlit_compat`)."""
import sys
from pathlib import Path

from ui.streamlit_compat import use_navigation_only


def main() -> None:
    from streamlit.web import cli

    use_navigation_only()
    app = str(Path(__file__).resolve().parents[1] / "app.py")
    sys.argv = ["streamlit", "run", app, *sys.argv[1:]]
    sys.exit(cli.main())


if __name__ == "__main__":
    main()
