"""Studio's curated RL environments. Each sub-directory is a self-contained package (stdlib only) whose
`__init__.py` exposes `load_environment(**kwargs)`, with its arguments in `config.py` (CONFIG) and its
own offline dataset (`data.jsonl`). A fork copies the directory's files into a project's environment
repo; the engine loads that copy from the staged directory, never this one."""
