"""One stage of a two-stage pipeline-parallel training job with a Monitor attached.

``python -m torch.distributed.run --nproc-per-node 2 tests/_pipeline_worker.py pp OUT_DIR``

Trains the tiny Mixtral of ``tests/_sharded_worker.py`` on the same global batches, split the
way torchtitan splits a model into pipeline stages: every rank builds the whole model from the
same seed, then replaces what belongs to the other stage by ``nn.Identity`` so that its
parameters are gone while the kept modules keep their original names (rank 0:
``model.embed_tokens`` and ``model.layers.0``; rank 1: ``model.layers.1``, ``model.norm`` and
``lm_head``). The forward and backward are run by hand with ``dist.send``/``dist.recv`` of the
hidden states between layer 0 and layer 1 and of their gradient, so no data parallelism: both
stages see the whole batch, and the losses must follow the single process's. Each rank writes
``OUT_DIR/records-<rank>.jsonl`` and ``OUT_DIR/status-<rank>.json`` (only the last stage has
losses; rank 0's list is empty).
"""

from __future__ import annotations

import json
import os
import sys
from datetime import timedelta
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))

from _sharded_worker import EVERY, SEQ, STEPS, VOCAB, batches, tiny_mixtral

torch.set_num_threads(1)

STAGES = 2


def keep_stage(model: torch.nn.Module, stage: int) -> torch.nn.Module:
    """Drop the other stage's modules in place; the kept ones keep their names, as in
    torchtitan, so that the Monitor sees ``model.layers.1`` on the last stage, not a renamed
    ``layers.0``."""
    inner = model.model
    if stage == 0:
        inner.layers[1] = torch.nn.Identity()
        inner.norm = torch.nn.Identity()
        model.lm_head = torch.nn.Identity()
    else:
        inner.embed_tokens = torch.nn.Identity()
        inner.layers[0] = torch.nn.Identity()
    return model


def run_layer(model: torch.nn.Module, index: int, hidden: torch.Tensor) -> torch.Tensor:
    """Decoder layer ``index`` called as ``MixtralModel.forward`` calls it: rotary position
    embeddings and the causal mask are recomputed per stage from the hidden states' shape (they
    carry no parameters, so both stages can build them)."""
    from transformers.masking_utils import create_causal_mask

    inner = model.model
    position_ids = torch.arange(hidden.shape[1], device=hidden.device).unsqueeze(0)
    mask = create_causal_mask(
        config=inner.config,
        inputs_embeds=hidden,
        attention_mask=None,
        cache=None,
        position_ids=position_ids,
    )
    return inner.layers[index](
        hidden,
        attention_mask=mask,
        position_ids=position_ids,
        position_embeddings=inner.rotary_emb(hidden, position_ids=position_ids),
    )


def causal_lm_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """The loss of ``model(input_ids=..., labels=...)``: transformers shifts ``labels`` once
    more (token i predicts label i+1, the last position is ignored), then takes the mean
    cross-entropy in float32."""
    shifted = logits[:, :-1].float().reshape(-1, VOCAB)
    return torch.nn.functional.cross_entropy(shifted, labels[:, 1:].reshape(-1))


def first_stage_step(model: torch.nn.Module, batch: torch.Tensor) -> None:
    """Embed and run layer 0, send the hidden states on, and backpropagate the gradient that
    comes back."""
    import torch.distributed as dist

    hidden = run_layer(model, 0, model.model.embed_tokens(batch[:, :-1]))
    dist.send(hidden.detach().contiguous(), dst=1)
    grad = torch.empty_like(hidden)
    dist.recv(grad, src=1)
    hidden.backward(grad)


def last_stage_step(model: torch.nn.Module, batch: torch.Tensor, hidden_size: int) -> torch.Tensor:
    """Receive layer 0's hidden states, finish the forward and the loss, backpropagate, and
    send the hidden states' gradient back; the loss."""
    import torch.distributed as dist

    received = torch.empty(batch.shape[0], SEQ, hidden_size)
    dist.recv(received, src=0)
    received.requires_grad_(True)
    hidden = model.model.norm(run_layer(model, 1, received))
    loss = causal_lm_loss(model.lm_head(hidden), batch[:, 1:])
    loss.backward()
    dist.send(received.grad.contiguous(), dst=0)
    return loss


def main(out_dir: Path) -> None:
    import torch.distributed as dist

    from foreshock.producers import JsonlSink, Monitor, MonitorConfig

    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    rank = dist.get_rank()
    assert dist.get_world_size() == STAGES, "one rank per pipeline stage"
    model = tiny_mixtral()
    hidden_size = model.config.hidden_size
    model = keep_stage(model, rank)
    monitor = Monitor(
        model,
        JsonlSink(out_dir / f"records-{rank}.jsonl"),
        run_id="sharded-pp",
        config=MonitorConfig(every=EVERY),
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.5)  # as the sharded worker
    monitor.watch_sdpa()
    losses = []
    for step, batch in enumerate(batches(0, 1)):  # every stage sees the whole global batch
        loss = None
        if rank == 0:
            first_stage_step(model, batch)
        else:
            loss = last_stage_step(model, batch, hidden_size)
            losses.append(float(loss.detach()))
        opt.step()
        monitor.step(step, loss=loss)
        opt.zero_grad()
    assert len(losses) == (STEPS if rank == STAGES - 1 else 0)
    monitor.close()
    status = {
        "rank": rank,
        "losses": losses,
        "errors": monitor.errors,
        "records_written": monitor.records_written,
        "describe": monitor.describe(),
    }
    (out_dir / f"status-{rank}.json").write_text(json.dumps(status))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    assert sys.argv[1] == "pp", "the only mode: two pipeline stages"
    main(Path(sys.argv[2]))
    # torch's gloo can abort in C++ teardown after a clean destroy_process_group; the work is
    # on disk, so skip interpreter finalization (as tests/_sharded_worker.py does).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
