import pytest

from draftsmith.chat import TemplateError, prepare_messages, tokenize_conversation


def supervised_text(tokenizer, tok):
    return tokenizer.decode([t for t, m in zip(tok.input_ids, tok.loss_mask, strict=True) if m])


def test_only_assistant_text_and_its_end_token_are_supervised(tokenizer):
    messages = [{"role": "user", "content": "Say hi."}, {"role": "assistant", "content": "Hi there!"},
                {"role": "user", "content": "Again."}, {"role": "assistant", "content": "Hello again."}]
    tok = tokenize_conversation(tokenizer, messages)
    assert len(tok.input_ids) == len(tok.loss_mask)
    assert supervised_text(tokenizer, tok) == "Hi there!<|im_end|>Hello again.<|im_end|>"
    # The full sequence is exactly what the template produces (round trip).
    expected = tokenizer.apply_chat_template(messages, tokenize=True)
    expected = expected["input_ids"] if hasattr(expected, "keys") else expected
    assert tok.input_ids == list(expected)
    # Boilerplate (system prompt the template injects, role headers, user turns) is not supervised.
    unsupervised = tokenizer.decode([t for t, m in zip(tok.input_ids, tok.loss_mask, strict=True) if not m])
    assert "Say hi." in unsupervised and "<|im_start|>assistant" in unsupervised


def test_reasoning_modes():
    messages = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a", "reasoning": "r"}]
    assert prepare_messages(messages, "template")[1] == {"role": "assistant", "content": "a", "reasoning_content": "r"}
    assert prepare_messages(messages, "think_tags")[1]["content"] == "<think>\nr\n</think>\n\na"
    assert prepare_messages(messages, "drop")[1] == {"role": "assistant", "content": "a"}


def test_template_that_is_not_prefix_stable_is_refused(tokenizer):
    # A template that renders the last assistant turn differently from earlier ones.
    class Odd:
        def apply_chat_template(self, messages, tokenize=False, add_generation_prompt=False, **kw):
            body = "".join(f"[{m['role']}]{m['content']}" for m in messages)
            return body + ("[assistant]" if add_generation_prompt else "[end]")

    with pytest.raises(TemplateError, match="not prefix-stable"):
        tokenize_conversation(Odd(), [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
                                      {"role": "user", "content": "c"}])
