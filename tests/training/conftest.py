"""Fixtures for the algorithm tests (helpers live in test_algos_support.py: a unique module
name, since several test directories have a conftest.py)."""

from __future__ import annotations

import warnings
from collections.abc import Iterator

import pytest
import torch


@pytest.fixture
def one_torch_thread() -> Iterator[None]:
    # Small nets on a shared 2-core CI box: one intra-op thread is the fastest and reproducible.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*precision lowered.*")
        yield
    torch.set_num_threads(threads)
