"""`ortllm adapters train --data`: the JSONL checks (every bad line named with its number, before anything is
loaded or written) and the loss mask (the assistant turns only, as the runtime renders the chat)."""
from __future__ import annotations

import json

import pytest

from ortllm.pipeline.adapter_train import load_examples
from ortllm.pipeline.train_config import TrainConfig
from ortllm.pipeline.train_data import IGNORE, ChatEncoder, TrainDataError, read_jsonl
from ortllm.runtime.tokenizer import Tokenizer
from tests.artifact_copies import linked_copy


def _encoder(artifact, max_len=512) -> ChatEncoder:
    eos = json.loads((artifact / "generation.json").read_text())["eos_token_ids"]
    return ChatEncoder(Tokenizer.from_dir(artifact), eos, max_len)


def _chat(*turns) -> dict:
    return {"messages": [{"role": r, "content": c} for r, c in turns]}


GOOD = json.dumps(_chat(("user", "hi"), ("assistant", "Arr!")))
BAD_LINES = {        # line number -> (its text, what the report must say)
    2: ("{not json", "not JSON"),
    3: ("[1, 2]", "a JSON object is expected, got list"),
    4: (json.dumps({"text": "hello"}), 'needs "messages"'),
    5: (json.dumps(_chat(("user", "hi"))), "no assistant message"),
    6: (json.dumps(_chat(("user", "hi"), ("bot", "yo"))), "message 2 has role 'bot'"),
    7: (json.dumps({"messages": [{"role": "user"}, {"role": "assistant", "content": "x"}]}),
        'message 1 (user) has no "content" string'),
    8: (json.dumps(_chat(("user", "word " * 400), ("assistant", "ok"))), "longer than the model's context (512)"),
    9: (json.dumps({"prompt": "hi", "completion": 3}), '"prompt" and "completion" must both be strings'),
    10: (json.dumps({"messages": []}), '"messages" must be a non-empty list'),
}


def test_bad_lines_are_named_with_their_numbers(tiny_engine, tmp_path):
    lines = [GOOD] + [BAD_LINES[n][0] for n in sorted(BAD_LINES)] + ["", GOOD]     # 11 blank: skipped
    data = tmp_path / "chats.jsonl"
    data.write_text("\n".join(lines) + "\n")
    with pytest.raises(TrainDataError) as err:
        read_jsonl(data, _encoder(tiny_engine))
    msg = str(err.value)
    assert f"{len(BAD_LINES)} bad lines of 11" in msg, msg
    for n, (_, what) in BAD_LINES.items():
        row = next((r for r in msg.splitlines() if r.strip().startswith(f"line {n}:")), None)
        assert row is not None and what in row, (n, what, msg)
    assert "line 1:" not in msg and "line 12:" not in msg and "line 13:" not in msg


def test_bad_data_stops_the_command_before_anything_is_written(tiny_engine, tmp_path, capsys):
    """The CLI's one-line error lists the bad lines; the artifact is untouched and no work directory is made."""
    from ortllm.cli import main

    art = linked_copy(tiny_engine, tmp_path / "art")
    before = {p.relative_to(art): p.read_bytes() for p in art.rglob("*") if p.is_file()}
    data = tmp_path / "chats.jsonl"
    data.write_text(GOOD + "\n" + BAD_LINES[5][0] + "\n")
    assert main(["adapters", "train", str(art), "--data", str(data), "--name", "x", "--steps", "2"]) == 1
    err = capsys.readouterr().err
    assert "ortllm: error:" in err and "line 2: no assistant message" in err, err
    assert {p.relative_to(art): p.read_bytes() for p in art.rglob("*") if p.is_file()} == before
    assert not (tmp_path / ".ortllm-train").exists()


@pytest.mark.parametrize("fixture", ["tiny_engine", "smollm2_engine"])
def test_loss_masks_everything_but_the_assistant_turns(fixture, request):
    """Labels are the reply tokens (through the end-of-turn token) of every assistant turn and -100 elsewhere;
    the tokens before each reply are what the runtime feeds for that turn's prompt."""
    artifact = request.getfixturevalue(fixture)
    enc = _encoder(artifact, max_len=2048)
    tok = enc.tok
    msgs = [{"role": "system", "content": "Talk like a pirate."}, {"role": "user", "content": "Hello there"},
            {"role": "assistant", "content": "Arr, ahoy!"}, {"role": "user", "content": "And the sea?"},
            {"role": "assistant", "content": "Wet, matey."}]
    ex = enc.encode(msgs)
    assert len(ex.ids) == len(ex.labels)
    trained = [i for i, t in enumerate(ex.labels) if t != IGNORE]
    assert all(ex.labels[i] == ex.ids[i] for i in trained)
    # two runs of labelled tokens, each a reply and its end-of-turn token
    runs, cur = [], [trained[0]]
    for i in trained[1:]:
        if i == cur[-1] + 1:
            cur.append(i)
        else:
            runs.append(cur)
            cur = [i]
    runs.append(cur)
    assert [tok.decode([ex.ids[i] for i in r], skip_special_tokens=False) for r in runs] == \
        ["Arr, ahoy!<|im_end|>", "Wet, matey.<|im_end|>"]
    # the context before each reply is the runtime's prompt for that turn (add_generation_prompt=True)
    for run, upto in zip(runs, (2, 4)):
        prompt = tok.encode(tok.apply_chat_template(msgs[:upto], add_generation_prompt=True))
        assert list(ex.ids[:run[0]]) == prompt
    # the whole example is the rendered chat
    full = tok.apply_chat_template(msgs, add_generation_prompt=False)
    assert tok.decode(ex.ids, skip_special_tokens=False) == full
    # a prompt/completion line is the chat of one user turn and its reply
    pc = enc.encode([{"role": "user", "content": "Hello there"}, {"role": "assistant", "content": "Arr, ahoy!"}])
    assert pc.trained_tokens == len(runs[0])


def test_eval_split_is_held_out_and_seeded(tiny_engine, tmp_path):
    data = tmp_path / "chats.jsonl"
    data.write_text("".join(json.dumps(_chat(("user", f"q{i}"), ("assistant", f"a{i}"))) + "\n" for i in range(20)))
    cfg = TrainConfig(data=str(data), eval_split=0.1)
    train, held = load_examples(tiny_engine, cfg)
    assert len(train) == 18 and len(held) == 2
    assert {e.line for e in train}.isdisjoint({e.line for e in held})
    assert [e.line for e in load_examples(tiny_engine, cfg)[1]] == [e.line for e in held]
