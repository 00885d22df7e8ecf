"""Arguments of this environment: edit them in your fork (load_environment(**CONFIG) is what runs)."""

CONFIG = {
    "name": "gsm-maths",
    "description": "Grade-school maths word problems with a numeric answer after '####'.",
    "data_file": "data.jsonl",
    "system_prompt": "Solve the problem. Think briefly, then give the final answer as '#### <number>'.",
    "answer_marker": "####",
    # total = sum(weight * component); components are each in [0, 1]
    "weights": {"correct": 0.7, "close": 0.2, "format": 0.1},
    "max_examples": None,
}
