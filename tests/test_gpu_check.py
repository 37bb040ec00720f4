"""The GPU check is ready to run: its smoke run on CPU prints its table and its JSON, and
without CUDA it says so instead of measuring the wrong device."""

from __future__ import annotations

import json

import pytest
import torch

from benchmarks import gpu_check


def test_the_smoke_run_measures_the_monitor_and_ends_with_its_json(capsys):
    gpu_check.main(["--device", "cpu", "--quick", "--every", "2"])
    lines = capsys.readouterr().out.strip().splitlines()
    result = json.loads(lines[-1])
    assert result["benchmark"] == "gpu_check" and result["anchor"]["ms"] == 211
    (row,) = result["rows"]
    assert row["step_ms"] > 0 and row["monitor_ms"] > 0  # the Monitor measured, timed
    assert any(line.startswith("anchor:") for line in lines)


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is here: the real run applies")
def test_without_cuda_it_refuses_to_measure():
    with pytest.raises(SystemExit, match="no CUDA device here"):
        gpu_check.main([])
