import pytest
import torch


@pytest.fixture(autouse=True, scope="session")
def _threads():
    """Tiny models: one thread avoids wake-up overhead and keeps timings steady on 2 cores."""
    torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _environment():
    """Each test starts from the environment the session started with: the dashboard, run in-process by AppTest,
    may set LOOPSCOPE_READ_ONLY (a server beyond localhost is read-only), which must not reach the next test."""
    import os

    saved = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(saved)
