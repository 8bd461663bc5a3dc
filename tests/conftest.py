import pytest
import torch


@pytest.fixture(autouse=True, scope="session")
def _threads():
    """Tiny models: one thread avoids wake-up overhead and keeps timings steady on 2 cores."""
    torch.set_num_threads(1)
