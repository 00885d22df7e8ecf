"""The console log's formatter (settings.LOGGING)."""
from __future__ import annotations

import logging


class ConsoleFormatter(logging.Formatter):
    """A 4xx that Django logs (django.request, django.security.*: a viewer's 403, a 400 for a bad
    body) is an answer the Studio meant to give, not a crash: one line, without the traceback of the
    exception that produced it, which reads like one. A 5xx keeps its traceback. Only this console's
    text changes: the record, and any other handler's view of it, keep the exception."""

    def format(self, record: logging.LogRecord) -> str:
        status = getattr(record, "status_code", None)
        if isinstance(status, int) and 400 <= status < 500 and (record.exc_info or record.exc_text):
            record = logging.makeLogRecord({**record.__dict__, "exc_info": None, "exc_text": None})
        return super().format(record)
