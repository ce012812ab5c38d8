"""generate's chat requests as vLLM's chat endpoint takes them (#23, deliverable 6): OpenAI-style
``{"messages", "max_tokens"}`` items, ``--sequential`` and ``cached_tokens`` per output.

The block-for-block check against a real vLLM server is ``tests/vllm`` (``make test-vllm``); this
file checks the pieces on pagedkv alone: the items are read and refused as the other forms are,
rendered through the chat template with the generation prompt, and a request sent after the
previous one finished hits that one's blocks, while requests sent together do not.
"""
from __future__ import annotations

import json

import pytest

from pagedkv_core.cli import main
from pagedkv_core.cli.generate import load_prompts
from pagedkv_core.config import ConfigError

SYSTEM = "You are a terse assistant. Answer in one short sentence, precisely, with no extra remarks at all."


def _item(question: str, max_tokens: int = 3) -> dict:
    return {"messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}],
            "max_tokens": max_tokens}


def test_prompts_file_takes_chat_items_beside_the_other_forms(tmp_path):
    f = tmp_path / "p.json"
    f.write_text(json.dumps(["plain", {"prompt": "an object", "max_tokens": 2}, _item("Hi?", 4),
                             {"messages": [{"role": "user", "content": "no max_tokens"}]}]))
    assert load_prompts(str(f)) == [
        ("plain", None), ("an object", 2),
        ([{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Hi?"}], 4),
        ([{"role": "user", "content": "no max_tokens"}], None),
    ]


@pytest.mark.parametrize("item, fragment", [
    ({"messages": []}, "non-empty list"),
    ({"messages": "hello"}, "non-empty list"),
    ({"messages": [{"role": "user"}]}, 'expected {"role": str, "content": str}'),
    ({"messages": [{"role": "user", "content": ["parts"]}]}, 'expected {"role": str, "content": str}'),
    ({"messages": [{"role": "user", "content": "x", "name": "bob"}]}, "unknown key(s) name"),
    ({"messages": [{"role": "user", "content": "x"}], "model": "gpt"}, "unknown key(s) model"),
    ({"messages": [{"role": "user", "content": "x"}], "max_tokens": 0}, "max_tokens must be an integer >= 1"),
    ({"prompt": 5}, "prompt must be a string"),
    ({"other": 1}, "expected a string"),
])
def test_bad_chat_items_are_one_line_and_exit_2(tmp_path, capsys, item, fragment):
    f = tmp_path / "p.json"
    f.write_text(json.dumps([item]))
    with pytest.raises(ConfigError, match="item 0"):
        load_prompts(str(f))
    assert main(["generate", "--prompts-file", str(f), "--sequential", "--json"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error:") and "\n" not in err and fragment in err


def _generate(tmp_path, capsys, items, *extra) -> dict:
    f = tmp_path / "chat.json"
    f.write_text(json.dumps(items))
    rc = main(["generate", "--prompts-file", str(f), "--json", "--device", "cpu", "--threads", "1",
               "--block-size", "16", "--pool-slots", "1024", "--temperature", "0", *extra])
    out = capsys.readouterr()
    assert rc == 0, out.err
    return json.loads(out.out)


@pytest.mark.slow
def test_sequential_chat_items_hit_the_previous_requests_blocks(tmp_path, capsys):
    from transformers import AutoTokenizer

    from pagedkv_core.sources.model.loader import convert_once, gguf_cache_dir, resolve_source
    from pagedkv_core.record.trace_file import read_trace

    source = resolve_source(None)
    convert_once(source)
    tokenizer = AutoTokenizer.from_pretrained(gguf_cache_dir(source), local_files_only=True)
    items = [_item("What is the capital of France?"), _item("What is the capital of France?"),
             _item("What is the capital of Italy?")]
    rendered = [tokenizer.apply_chat_template(i["messages"], add_generation_prompt=True, tokenize=True,
                                              return_dict=True)["input_ids"] for i in items]

    trace = tmp_path / "seq.jsonl"
    seq = _generate(tmp_path, capsys, items, "--sequential", "--chat", "--trace-out", str(trace))
    outs = seq["outputs"]
    assert [o["prompt_token_ids"] for o in outs] == rendered, "the chat template with the generation prompt"
    assert outs[0]["token_ids"] == outs[1]["token_ids"] and len(outs[0]["token_ids"]) == 3
    length = len(rendered[0])
    shared = next(i for i, (a, b) in enumerate(zip(rendered[0], rendered[2])) if a != b)
    assert [o["cached_tokens"] for o in outs] == [0, (length - 1) // 16 * 16, shared // 16 * 16], \
        "a repeat hits every block below its last token; the next question its shared blocks"
    # one request at a time: each is admitted after the previous one finished
    header, snaps = read_trace(trace)
    admitted = {e.request_id: s.step for s in snaps for e in s.events if e.kind == "admit"}
    finished = {e.request_id: s.step for s in snaps for e in s.events if e.kind == "finish"}
    assert finished["0"] < admitted["1"] and finished["1"] < admitted["2"]
    assert [r["id"] for r in header["requests"]] == ["0", "1", "2"], "the trace names every request"

    together = _generate(tmp_path, capsys, items)  # all queued at once: admitted in one step, no blocks yet
    assert [o["cached_tokens"] for o in together["outputs"]] == [0, 0, 0]
    assert [o["token_ids"] for o in together["outputs"]] == [o["token_ids"] for o in outs]
