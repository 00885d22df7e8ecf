"""RL environment repos arrive with the environments issue; builtin/arith ships with the engine."""
