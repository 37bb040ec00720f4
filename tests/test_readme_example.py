"""The README's plain-loop example, run as written, leaves a file the CLI reads: ``foreshock
detect --replay`` judges it and ``foreshock store import`` stores it (a Monitor on a local
sink writes the run's ``start`` and ``end`` records when nothing else does)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from foreshock.app.cli import main
from foreshock.lab.data import ByteBatches, stdlib_bytes
from foreshock.lab.model import GPT, GPTConfig
from foreshock.transport.run_files import load_run

README = Path(__file__).resolve().parents[1] / "README.md"


def readme_example() -> str:
    section = README.read_text().split("## A minimal example", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.S)[1]


class LanguageModel(torch.nn.Module):
    """The example's ``model(x, y)``: the lab's tiny GPT-MoE, returning its loss."""

    def __init__(self) -> None:
        super().__init__()
        self.gpt = GPT(GPTConfig(block_size=32, n_layer=2, n_head=2, n_embd=32, n_experts=4))

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return self.gpt(x, y)[1]


@pytest.mark.slow
def test_the_readme_example_writes_a_file_detect_and_store_import_accept(
    tmp_path, monkeypatch, capsys
):
    torch.manual_seed(0)
    monkeypatch.chdir(tmp_path)
    model = LanguageModel()
    batches = ByteBatches(stdlib_bytes(200_000), 32, 8, seed=0)
    loader = [batches.next() for _ in range(60)]
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    exec(readme_example(), {"model": model, "loader": loader, "optimizer": optimizer})

    run = load_run(tmp_path / "runs" / "r1.jsonl")
    assert run.start["run_id"] == "r1" and run.start["monitor"]["signature"]["experts"] == 4
    assert [r["step"] for r in run.records] == list(range(0, 60, 10))
    assert run.records[-1]["values"]["lr"] == pytest.approx(1e-3)
    assert (run.end["status"], run.end["last_step"]) == ("finished", 59)
    assert main(["detect", "--replay", "runs/r1.jsonl"]) == 0
    assert "r1: profile zero-shot" in capsys.readouterr().out
    assert main(["store", "import", "--store", "history", "runs/r1.jsonl"]) == 0
