"""Build a tiny, random-weight cross-encoder on disk, loadable through the real path."""

from __future__ import annotations

from pathlib import Path

WORDS = (
    "the a an of to in on for and or is are was were be by with from at as it this that how do i "
    "what when where why who which after before during under over payment gateway checkout error errors "
    "502 outage recover recovery restart reset certificate tls load balancer dns retry retries region "
    "failover database migration search index cache cdn purge email bounce laptop leave coffee invoice "
    "vendor release mobile trace tracing design token colour spacing status dashboard service pods "
    "date january february march april may june july august september october november december"
).split()


def build_tiny_cross_encoder(directory: Path, *, seed: int = 0, layers: int = 2, hidden: int = 32) -> Path:
    import torch
    from transformers import BertConfig, BertForSequenceClassification, BertTokenizerFast

    directory.mkdir(parents=True, exist_ok=True)
    letters = list("abcdefghijklmnopqrstuvwxyz0123456789")
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *".,:;>()[]-'\"?!/", *letters,
             *[f"##{c}" for c in letters], *dict.fromkeys(WORDS)]
    vocab = list(dict.fromkeys(vocab))
    vocab_file = directory / "vocab.txt"
    vocab_file.write_text("\n".join(vocab) + "\n")
    tokenizer = BertTokenizerFast(vocab=str(vocab_file), do_lower_case=True, model_max_length=128)
    torch.manual_seed(seed)
    config = BertConfig(
        vocab_size=len(vocab), hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=2,
        intermediate_size=hidden * 2, max_position_embeddings=128, num_labels=1,
    )
    model = BertForSequenceClassification(config)
    # At the default init a random BERT's [CLS] barely depends on the other tokens
    # (near-uniform attention over tiny values), so every pair would score alike.
    # Louder values, outputs and head make the scores spread like a real model's.
    with torch.no_grad():
        for layer in model.bert.encoder.layer:
            layer.attention.self.value.weight.mul_(10.0)
            layer.attention.self.query.weight.mul_(5.0)
            layer.attention.self.key.weight.mul_(5.0)
            layer.attention.output.dense.weight.mul_(10.0)
        model.bert.pooler.dense.weight.mul_(10.0)
        model.classifier.weight.mul_(5.0)
    model.eval()
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory
