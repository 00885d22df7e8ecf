"""Data Hub repos, branches and commits arrive with the Data Hub issue (see datahub/services.py)."""
