"""No tables: environment repos are Data Hub repos of type environment; the catalogue ships as
packages under environments/catalogue/ (see services.py)."""
