"""Test-wide setup.

TRITON_INTERPRET must be set before any Triton kernel module is imported, so that the
kernel tests run the real Triton code on the CPU interpreter.
"""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# Under pytest-xdist (make test runs two workers on two cores) each worker's torch, and the
# servers and CLIs it starts, use one thread: two workers with a thread per core each would
# oversubscribe the cores.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_NUM_THREADS", "1")


def pytest_collection_modifyitems(config, items):
    """For ``--dist loadgroup`` (make test): every browser test in one group, so that one worker
    runs them one after another (two browsers drawing at once on two cores time each other out),
    and every other test grouped by its file, as ``--dist loadfile`` would (a module's fixtures,
    such as a loaded model, are built once)."""
    import pytest

    for item in items:
        group = "browser" if item.get_closest_marker("browser") else item.nodeid.split("::")[0]
        item.add_marker(pytest.mark.xdist_group(group))
