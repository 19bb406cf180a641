"""PyTorch's `nn.Transformer` at the benchmark's size: the eager-mode reference.

Imported only when torch is installed (`pip install -e ".[bench-torch]"`).
"""

import math

import torch
from torch import nn

from config import SMALL, sinusoids


class TorchTranslator(nn.Module):
    """Embeddings x sqrt(d_model) + sinusoids, `nn.Transformer` (post-LN, ReLU), linear logits."""

    def __init__(self, config=SMALL):
        super().__init__()
        d_model = config["d_model"]
        self.scale = math.sqrt(d_model)
        self.source_embedding = nn.Embedding(config["vocab_size"], d_model, padding_idx=0)
        self.target_embedding = nn.Embedding(config["vocab_size"], d_model, padding_idx=0)
        self.register_buffer("positions", torch.from_numpy(sinusoids(1024, d_model)), persistent=False)
        self.dropout = nn.Dropout(config["dropout"])
        self.transformer = nn.Transformer(
            d_model=d_model,
            nhead=config["num_heads"],
            num_encoder_layers=config["num_layers"],
            num_decoder_layers=config["num_layers"],
            dim_feedforward=config["d_ff"],
            dropout=config["dropout"],
            layer_norm_eps=1e-6,
            batch_first=True,
        )
        self.output = nn.Linear(d_model, config["vocab_size"])

    def embed(self, embedding, ids):
        return self.dropout(embedding(ids) * self.scale + self.positions[: ids.shape[1]])

    def forward(self, source_ids, target_ids):
        causal = nn.Transformer.generate_square_subsequent_mask(target_ids.shape[1], device=target_ids.device)
        hidden = self.transformer(
            self.embed(self.source_embedding, source_ids),
            self.embed(self.target_embedding, target_ids),
            tgt_mask=causal,
            tgt_is_causal=True,
            src_key_padding_mask=source_ids == 0,
            tgt_key_padding_mask=target_ids == 0,
            memory_key_padding_mask=source_ids == 0,
        )
        return self.output(hidden).float()


def training_step(model, optimizer, autocast, source, target_in, target_out):
    """One Adam step on cross-entropy; returns when the step has finished."""
    with autocast:
        logits = model(source, target_in)
    loss = nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), target_out.reshape(-1))
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    float(loss)  # wait for the step, as Keras' fit does for its logs


def train_steps(dtype, batches, windows):
    """Train on `batches` (numpy (source, target_in, target_out)) in a loop until `windows` is done."""
    torch.manual_seed(0)
    model = TorchTranslator()
    model.train()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
    batches = [tuple(torch.from_numpy(array).long() for array in batch) for batch in batches]
    autocast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == "bfloat16")
    step = 0
    while not windows.done:
        training_step(model, optimizer, autocast, *batches[step % len(batches)])
        windows.step_done()
        step += 1
    return sum(p.numel() for p in model.parameters())
