"""Arguments of this environment: edit them in your fork (load_environment(**CONFIG) is what runs)."""

CONFIG = {
    "name": "multiple-choice",
    "description": "General-knowledge questions with four options; answer with the option's letter.",
    "data_file": "data.jsonl",
    "system_prompt": "Answer with the letter of the correct option, like 'Answer: B'.",
    "letters": "ABCD",
    "shuffle_options": False,
    "weights": {"correct": 0.8, "format": 0.2},
    "max_examples": None,
}
