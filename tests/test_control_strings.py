"""The rule every model door applies to a caller's text: a control string is broken so that no
tokenizer reads it as its control token, and text without one passes unchanged."""

from __future__ import annotations

from pathlib import Path

from worker.control_strings import REMOTE, ControlStrings, of_tokenizer


def test_text_without_control_strings_passes_unchanged():
    text = "a <b>bold</b> [note] about 3 < 4 | 5 > 2 and <|not closed"
    assert REMOTE.neutralise(text) is text
    assert ControlStrings.of_strings(["<|im_end|>", "[SEP]"]).neutralise(text) is text


def test_every_occurrence_is_broken_overlapping_ones_too():
    rule = ControlStrings.of_strings(["<|a|>", "a|><|b", "[SEP]"])
    # "a|><|b" starts inside the first "<|a|>": both are broken, and neither survives.
    out = rule.neutralise("x<|a|><|b|>[SEP][SEP]")
    assert out == "x< |a |><|b|>[ SEP][ SEP]"
    assert all(s not in out for s in ("<|a|>", "a|><|b", "[SEP]"))


def test_a_control_string_a_space_cannot_break_is_replaced():
    assert ControlStrings.of_strings(["\u2029", "<|x|>"]).neutralise("a\u2029b <|x|>") == "a\ufffdb < |x|>"


def test_the_tokenizers_special_tokens_are_its_control_strings(tiny_model_dir: Path):
    from tokenizers import AddedToken
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    tokenizer.add_tokens([AddedToken("<think>", special=False)])
    tokenizer.add_special_tokens({"additional_special_tokens": [AddedToken("<|ctl|>", special=True)]})
    rule = of_tokenizer(tokenizer)

    text = "[CLS] a [SEP] b <|ctl|> c <think> [sep]"
    out = rule.neutralise(text)

    assert out == "[ CLS] a [ SEP] b < |ctl|> c <think> [sep]"
    # What was a special token is now ordinary text to the tokenizer; a non-special added token
    # (a word some vocabularies add) is left to the tokenizer, as split_special_tokens leaves it.
    special = {tokenizer.cls_token_id, tokenizer.sep_token_id, tokenizer.convert_tokens_to_ids("<|ctl|>")}
    assert not special & set(tokenizer(out, add_special_tokens=False)["input_ids"])
    assert special <= set(tokenizer(text, add_special_tokens=False)["input_ids"])


def test_the_remote_families_control_tokens_are_all_broken():
    tokens = [
        "<|im_start|>",
        "<|im_end|>",
        "<|endoftext|>",
        "<|eot_id|>",
        "<|start_header_id|>",
        "<\uff5cbegin\u2581of\u2581sentence\uff5c>",
        "<s>",
        "</s>",
        "<unk>",
        "<pad>",
        "<mask>",
        "<bos>",
        "<eos>",
        "<start_of_turn>",
        "<end_of_turn>",
        "<extra_id_0>",
        "<think>",
        "</think>",
        "[CLS]",
        "[SEP]",
        "[MASK]",
        "[INST]",
        "[/INST]",
        "[TOOL_CALLS]",
    ]
    for token in tokens:
        out = REMOTE.neutralise(f"a{token}b")
        assert out == f"a{token[0]} {token[1:]}b", token
