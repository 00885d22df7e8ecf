"""Arguments of this environment: edit them in your fork (load_environment(**CONFIG) is what runs)."""

CONFIG = {
    "name": "science-qa",
    "description": "Short-answer science questions; any listed alias of the answer counts.",
    "data_file": "data.jsonl",
    "system_prompt": "Answer the science question in a few words, like 'Answer: photosynthesis'.",
    "max_words": 12,
    "weights": {"correct": 0.7, "mentions": 0.2, "concise": 0.1},
    "max_examples": None,
}
