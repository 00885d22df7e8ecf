"""Arguments of this environment: edit them in your fork (load_environment(**CONFIG) is what runs)."""

CONFIG = {
    "name": "calculator",
    "description": "Arithmetic problems solved with a calculator tool called inside the rollout.",
    "data_file": "data.jsonl",
    "system_prompt": (
        "You may use a calculator: write <calc>EXPRESSION</calc> and the result comes back as "
        "<result>VALUE</result>; then continue. Finish with 'Answer: <number>'."
    ),
    # The rollout stops at </calc>, gets the tool's result appended, and continues, up to this many times.
    "max_tool_calls": 3,
    "weights": {"correct": 0.7, "tool_use": 0.2, "format": 0.1},
    "max_examples": None,
}
