import pytest
import torch


@pytest.fixture(autouse=True, scope="session")
def _threads():
    """Tiny models: one thread avoids wake-up overhead and keeps timings steady on 2 cores."""
    torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _environment():
    """Each test starts from the environment and the __main__ module the session started with: the dashboard, run
    in-process by AppTest, may set LOOPSCOPE_READ_ONLY (a server beyond localhost is read-only), which must not reach
    the next test."""
    import os
    import sys

    saved, main = dict(os.environ), sys.modules["__main__"]
    yield
    os.environ.clear()
    os.environ.update(saved)
    # AppTest.from_function runs its script as __main__ and leaves it there; a process pool started later (--workers)
    # spawns children that import the parent's __main__, a temporary file that no longer defines what it calls
    sys.modules["__main__"] = main
