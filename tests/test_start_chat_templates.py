"""START reads the base model's chat template (training/chat_templates.py): rows that need a template
the model lacks, and SFT's assistant-only loss on a template that cannot mark the assistant's turns,
are a 422 on base_model naming the way out. QA ran them on tiny models: TRL failed each after START
("chat_template is not set", "The chat template is not training-compatible")."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from studio.models import Plan
from tests.test_start_validation import assert_start_refused, make_run, start
from training.engine.tiny import CHAT_TEMPLATE

CHATML = ("{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}{% endfor %}"
          "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
MISTRAL = ("{{ bos_token }}{% for message in messages %}{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}"
           "{% else %}{{ message['content'] + eos_token }}{% endif %}{% endfor %}")
CHAT_ROW = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}
DPO = {"method": "dpo", "config": {"loss": {"type": "dpo"}, "lora_rank": 8}}


def model(path: Path, template: str | None, jinja: bool = False) -> str:
    """A model folder as save_pretrained writes its tokenizer: the template in tokenizer_config.json
    (transformers 4) or chat_template.jinja (transformers 5), or none at all."""
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    tokenizer_config: dict = {"tokenizer_class": "PreTrainedTokenizerFast"}
    if template is not None and jinja:
        (path / "chat_template.jinja").write_text(template)
    elif template is not None:
        tokenizer_config["chat_template"] = template
    (path / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))
    return str(path)


def rows(path: Path, *items: dict) -> str:
    path.write_text("".join(json.dumps(item) + "\n" for item in items))
    return str(path)


def messages(body: dict, field: str = "base_model") -> list[str]:
    return [e["message"] for e in body["errors"] if e["field"] == field]


@pytest.mark.parametrize("template", [CHATML, MISTRAL])
def test_sft_on_chat_rows_with_a_template_without_generation_markers_is_refused(api, tmp_path, template):
    base = model(tmp_path / "m", template)
    chat = rows(tmp_path / "chat.jsonl", CHAT_ROW)
    body = assert_start_refused(api, make_run(api, base_model=base, dataset=chat), 422, "base_model")
    said = messages(body)[0]
    assert "cannot mark the assistant's turns" in said and "set config.assistant_only_loss to false" in said, said
    # The lever works: whole conversations need no markers.
    run_id = make_run(api, base_model=base, dataset=chat, config={"assistant_only_loss": False})
    assert "base_model" not in [e["field"] for e in start(api, run_id).json().get("errors", [])]


def test_templates_with_markers_or_that_trl_patches_pass(api, project, tmp_path):
    Plan.objects.filter(pk=project.plan_id).update(max_concurrent_runs=10)
    qwen2_5 = (Path(__import__("trl").__file__).parent / "chat_templates" / "qwen2_5.jinja").read_text()  # TRL has a training version
    chat = rows(tmp_path / "chat.jsonl", CHAT_ROW)
    for name, template, jinja in (("marked", CHAT_TEMPLATE, False), ("marked-jinja", CHAT_TEMPLATE, True), ("qwen", qwen2_5, True)):
        run_id = make_run(api, base_model=model(tmp_path / name, template, jinja), dataset=chat)
        assert start(api, run_id).status_code == 202, (name, start(api, run_id).content)


def test_chat_rows_on_a_model_without_a_chat_template_are_refused(api, project, tmp_path):
    Plan.objects.filter(pk=project.plan_id).update(max_concurrent_runs=10)
    base = model(tmp_path / "m", None)
    chat = rows(tmp_path / "chat.jsonl", CHAT_ROW)
    for overrides in ({}, {"method": "distill", "config": {"distillation": {"teacher_model": base}}}):
        body = assert_start_refused(api, make_run(api, base_model=base, dataset=chat, **overrides), 422, "base_model")
        assert "has no chat template" in messages(body)[0] and "use text or prompt/completion rows" in messages(body)[0], body
    # Text rows need no template.
    text = rows(tmp_path / "text.jsonl", {"text": "hello"})
    assert start(api, make_run(api, base_model=base, dataset=text)).status_code == 202


def test_dpo_chat_prompts_or_a_system_prompt_on_a_model_without_a_chat_template_are_refused(api, project, tmp_path):
    Plan.objects.filter(pk=project.plan_id).update(max_concurrent_runs=10)
    base = model(tmp_path / "m", None)
    conversational = rows(tmp_path / "conv.jsonl", {"prompt": [{"role": "user", "content": "q"}],
                                                    "chosen": [{"role": "assistant", "content": "a"}], "rejected": [{"role": "assistant", "content": "b"}]})
    text = rows(tmp_path / "text.jsonl", {"prompt": "q", "chosen": "a", "rejected": "b"})
    assert_start_refused(api, make_run(api, base_model=base, dataset=conversational, **DPO), 422, "base_model")
    with_system = {**DPO, "config": {**DPO["config"], "system_prompt": "Be terse."}}
    body = assert_start_refused(api, make_run(api, base_model=base, dataset=text, **with_system), 422, "base_model")
    assert "config.system_prompt is set" in messages(body)[0], body
    assert start(api, make_run(api, base_model=base, dataset=text, **DPO)).status_code == 202


def test_a_data_hub_base_model_without_a_chat_template_is_refused(api, project, tmp_path):
    from datahub.commits import commit_files
    from datahub.repos import create_repo

    folder = Path(model(tmp_path / "plain", None))
    commit_files(create_repo(project, "plain", "model"), "main", {p.name: p for p in folder.iterdir()}, message="plain")
    chat = rows(tmp_path / "chat.jsonl", CHAT_ROW)
    assert_start_refused(api, make_run(api, base_model="plain@main", dataset=chat), 422, "base_model")
