import os
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]

torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))


@pytest.fixture
def in_tmp(tmp_path, monkeypatch):
    """Run in an empty folder: artifacts land in tmp_path/models."""
    monkeypatch.chdir(tmp_path)
    return tmp_path
