"""What the Studio's console log says about requests: a deliberate 4xx (a viewer's 403, a 400 for a
bad body) is one line, written once; a 5xx keeps its traceback."""
from __future__ import annotations

import contextlib
import io
import logging
from collections.abc import Iterator

import pytest
from django.http import HttpResponse
from django.test import Client, RequestFactory
from django.utils.log import log_response

from tests.conftest import sft_body


@contextlib.contextmanager
def console() -> Iterator[io.StringIO]:
    """Everything the configured console handlers write (the root's and any Django adds), in one
    buffer: what a person reading the Studio's log sees. pytest's own handlers are left alone."""
    out = io.StringIO()
    loggers = [logging.getLogger(), *(logger for logger in logging.Logger.manager.loggerDict.values() if isinstance(logger, logging.Logger))]
    handlers = {h for logger in loggers for h in logger.handlers if type(h) is logging.StreamHandler}
    previous = {h: h.setStream(out) for h in handlers}
    try:
        yield out
    finally:
        for h, stream in previous.items():
            h.setStream(stream)


@pytest.fixture
def debug(settings):
    settings.DEBUG = True  # as `make studio` runs; Django's own console handler speaks only then
    return settings


@pytest.mark.parametrize("page", ["/training/new/", "/training/runs/{run}/edit/"])
def test_a_viewer_opening_a_page_they_may_not_use_logs_one_line_without_a_traceback(debug, api, users, page):
    url = page.format(run=api.post("/api/training-runs", sft_body()).json()["id"])
    client = Client()
    client.force_login(users["viewer"])
    with console() as out:
        assert client.get(url).status_code == 403
    assert out.getvalue().splitlines() == [f"Forbidden (Permission denied): {url}"], out.getvalue()


def test_a_request_for_another_host_logs_one_line_without_a_traceback(debug):
    # django.security's 400s: a DisallowedHost is logged at ERROR, with the exception.
    with console() as out:
        assert Client().get("/login/", HTTP_HOST="evil.example").status_code == 400
    lines = out.getvalue().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Invalid HTTP_HOST header: 'evil.example'"), lines


def test_a_400_from_the_api_logs_one_line_once(debug, api):
    with console() as out:
        assert api.post("/api/training-runs", sft_body(name=5)).status_code == 400
    assert out.getvalue().splitlines() == ["Bad Request: /api/training-runs"], out.getvalue()


def test_a_500_keeps_its_traceback(debug):
    request = RequestFactory().get("/boom/")
    with console() as out:
        try:
            raise RuntimeError("a real crash")
        except RuntimeError as exc:
            log_response("Internal Server Error: %s", request.path, response=HttpResponse(status=500), request=request, exception=exc)
    text = out.getvalue()
    assert text.count("Internal Server Error: /boom/") == 1 and "Traceback" in text and "RuntimeError: a real crash" in text
