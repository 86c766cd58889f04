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
    vocab = [
        "[PAD]",
        "[UNK]",
        "[CLS]",
        "[SEP]",
        "[MASK]",
        *".,:;>()[]-'\"?!/",
        *letters,
        *[f"##{c}" for c in letters],
        *dict.fromkeys(WORDS),
    ]
    vocab = list(dict.fromkeys(vocab))
    vocab_file = directory / "vocab.txt"
    vocab_file.write_text("\n".join(vocab) + "\n")
    tokenizer = BertTokenizerFast(vocab=str(vocab_file), do_lower_case=True, model_max_length=128)
    torch.manual_seed(seed)
    config = BertConfig(
        vocab_size=len(vocab),
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=2,
        intermediate_size=hidden * 2,
        max_position_embeddings=128,
        num_labels=1,
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


# A chat template in the shape of the Qwen3-Reranker family's: a fixed system turn, the
# instruction (sentence-transformers passes a prompt as a "system" message), the query and
# the document in their roles, then the assistant turn whose next token is read as yes/no.
CAUSAL_CHAT_TEMPLATE = (
    "{%- set ns = namespace(instruction='') -%}"
    "{%- for m in messages if m.role == 'system' %}{% set ns.instruction = m.content %}{% endfor -%}"
    "<|im_start|> system judge whether the document meets the query ; answer yes or no <|im_end|> "
    "<|im_start|> user instruct : {{ ns.instruction }} "
    "query : {{ messages | selectattr('role', 'eq', 'query') | map(attribute='content') | first }} "
    "document : {{ messages | selectattr('role', 'eq', 'document') | map(attribute='content') | first }} <|im_end|> "
    "<|im_start|> assistant"
)
CAUSAL_DEFAULT_PROMPT = "given a search query retrieve documents that answer it"


def _causal_vocab(directory: Path) -> Path:
    letters = list("abcdefghijklmnopqrstuvwxyz0123456789")
    vocab = [
        "[PAD]",
        "[UNK]",
        "[CLS]",
        "[SEP]",
        "[MASK]",
        "<|im_start|>",
        "<|im_end|>",
        *".,:;>()[]-'\"?!/",
        *letters,
        *[f"##{c}" for c in letters],
        "yes",
        "no",
        "judge",
        "whether",
        "document",
        "meets",
        "query",
        "answer",
        "system",
        "user",
        "assistant",
        "instruct",
        "given",
        "retrieve",
        "documents",
        "runbook",
        *dict.fromkeys(WORDS),
    ]
    vocab_file = directory / "vocab.txt"
    vocab_file.write_text("\n".join(dict.fromkeys(vocab)) + "\n")
    return vocab_file


def build_tiny_causal_reranker(
    directory: Path, *, seed: int = 0, layers: int = 2, hidden: int = 32, absolute_positions: bool = False
) -> Path:
    """A random causal-LM reranker saved as sentence-transformers 6 saves the Qwen3-Reranker
    family: ``Transformer(transformer_task="text-generation")`` + ``LogitScore(yes, no)``, a
    chat template with query/document roles and a default prompt.

    ``absolute_positions`` builds it on GPT-2 (learned absolute position embeddings) instead of
    Qwen3 (rotary): left padding then shifts every position, so its scores depend on how much
    padding a batch gives each pair, and no engine that batches differently from predict can
    give predict's numbers.
    """
    import torch
    from sentence_transformers import CrossEncoder
    from sentence_transformers.base.modules import Transformer
    from sentence_transformers.cross_encoder.modules import LogitScore
    from transformers import BertTokenizerFast, GPT2Config, GPT2LMHeadModel, Qwen3Config, Qwen3ForCausalLM

    source = directory.parent / f"{directory.name}-transformers"
    source.mkdir(parents=True, exist_ok=True)
    tokenizer = BertTokenizerFast(
        vocab=str(_causal_vocab(source)),
        do_lower_case=True,
        model_max_length=256,
        additional_special_tokens=["<|im_start|>", "<|im_end|>"],
    )
    tokenizer.chat_template = CAUSAL_CHAT_TEMPLATE
    torch.manual_seed(seed)
    if absolute_positions:
        model = GPT2LMHeadModel(
            GPT2Config(
                vocab_size=len(tokenizer),
                n_embd=hidden,
                n_layer=layers,
                n_head=2,
                n_positions=512,
                pad_token_id=tokenizer.pad_token_id,
                bos_token_id=tokenizer.cls_token_id,
                eos_token_id=tokenizer.sep_token_id,
            )
        )
        with torch.no_grad():
            model.transformer.wpe.weight.mul_(50.0)  # positions that matter, as in a trained model
    else:
        model = Qwen3ForCausalLM(
            Qwen3Config(
                vocab_size=len(tokenizer),
                hidden_size=hidden,
                intermediate_size=hidden * 2,
                num_hidden_layers=layers,
                num_attention_heads=4,
                num_key_value_heads=2,
                head_dim=hidden // 4,
                max_position_embeddings=512,
                tie_word_embeddings=True,
                pad_token_id=tokenizer.pad_token_id,
            )
        )
        # Louder weights, so the yes/no log-odds spread over the documents like a trained model's.
        with torch.no_grad():
            for parameter in model.parameters():
                if parameter.dim() > 1:
                    parameter.mul_(8.0)
    model.eval()
    model.save_pretrained(source)
    tokenizer.save_pretrained(source)
    transformer = Transformer(str(source), transformer_task="text-generation")
    score = LogitScore(
        true_token_id=tokenizer.convert_tokens_to_ids("yes"), false_token_id=tokenizer.convert_tokens_to_ids("no")
    )
    reranker = CrossEncoder(
        modules=[transformer, score],
        prompts={"search": CAUSAL_DEFAULT_PROMPT},
        default_prompt_name="search",
        device="cpu",
    )
    reranker.save_pretrained(str(directory))
    return directory


BI_ENCODER_PROMPTS = {"query": "query: ", "document": "passage: "}


def build_prompted_bi_encoder(directory: Path) -> Path:
    """The packaged all-MiniLM-L6-v2 saved with e5-style query/document prompts."""
    from sentence_transformers import SentenceTransformer

    from worker.providers.embedding import packaged_model

    path, _ = packaged_model()
    model = SentenceTransformer(path, device="cpu", prompts=dict(BI_ENCODER_PROMPTS))
    model.save_pretrained(str(directory))
    return directory
