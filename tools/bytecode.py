"""Byte-compiles, once at set-up, the modules that the app, the CLI and the tests import.

pip installs the pinned packages with ``--no-compile``. Where ``PYTHONDONTWRITEBYTECODE`` is set,
as it is on this project's machines, no later process writes a ``.pyc`` either, so without this
step every process would compile torch, transformers and Streamlit from source again (imports
10.1 s against 4.5). Byte-compiling the whole of ``.venv/lib`` (``compileall``) compiles about
15,000 files, most of which nothing here imports; importing what we use compiles only those
(about 3,500) and writes their ``.pyc``: 15 s against 26 (22 CPU-s against 50), back to back on
a 2-core AMD EPYC. The two halves below run at once, one process a core. What a test imports that is
not here (some of hypothesis, anyio, plotly's rarer classes: about 270 files) is compiled in
memory by the process that imports it, as before.

``python -m tools.bytecode`` (the Makefile's set-up runs it). A module that fails to import is
named on stderr and skipped: the set-up goes on, and the module compiles when it is used.
"""
from __future__ import annotations

import importlib
import pkgutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# What the engine and the model need, and what the pages and the tests need.
STACKS = {
    "model": ["numpy", "torch", "torch.nn.functional", "transformers", "transformers.models.llama.modeling_llama",
              "transformers.modeling_gguf_pytorch_utils", "transformers.integrations.ggml", "safetensors.torch",
              "gguf", "tokenizers", "accelerate", "triton", "triton.language", "triton.compiler",
              "triton.experimental.gluon", "msgspec", "zmq",
              "prometheus_client", "pagedkv_core", "kernels"],
    "app": ["streamlit", "streamlit.web.bootstrap", "streamlit.web.cli", "streamlit.web.server.server",
            "streamlit.testing.v1", "pandas", "pyarrow", "uvicorn", "uvicorn.main", "starlette.applications",
            "websockets", "anyio", "PIL.Image", "plotly.graph_objects", "plotly.io", "plotly.express",
            "playwright.sync_api", "pytest", "xdist", "hypothesis", "hypothesis.strategies", "ui"],
}
OWN_PACKAGES = ("pagedkv_core", "kernels", "ui")  # every module of these, but no __main__


def import_all(names: list[str]) -> list[str]:
    """Imports ``names`` (and every submodule of our own packages) with byte-code writing on;
    returns those that failed, with why."""
    sys.dont_write_bytecode = False
    failed = []

    def load(name: str) -> None:
        try:
            importlib.import_module(name)
        except BaseException as exc:  # noqa: BLE001 (a module's import may raise anything, even SystemExit)
            failed.append(f"{name}: {type(exc).__name__}: {exc}".splitlines()[0])

    for name in names:
        load(name)
        if name == "streamlit" and name in sys.modules:  # our modules' caches warn that no app runs
            import streamlit.logger

            streamlit.logger.set_log_level("error")
        if name in OWN_PACKAGES and name in sys.modules:
            package = sys.modules[name]
            for info in pkgutil.walk_packages(package.__path__, f"{name}."):
                if not info.name.endswith("__main__"):
                    load(info.name)
    return failed


def main() -> int:
    children = [subprocess.Popen([sys.executable, "-c", f"import sys; from tools.bytecode import import_all; "
                                  f"failed = import_all({names!r}); failed and print(*failed, sep='\\n', file=sys.stderr)"],
                                 cwd=ROOT)
                for names in STACKS.values()]
    return max(child.wait() for child in children)


if __name__ == "__main__":
    sys.exit(main())
