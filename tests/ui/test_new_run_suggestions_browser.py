"""NEW RUN's field suggestions in a real browser: each field's `list` resolves to its datalist, the
dataset's follows the method picker's HTMX swap, and the help is the field's accessible description."""
from __future__ import annotations

import io
import json
import re

from django.core.management import call_command
from playwright.sync_api import expect

from training.suggestions import demo_marker


def test_suggestions_reach_the_fields_and_follow_the_method_picker(owner_page, project, settings, tmp_path):
    settings.VAR_DIR = tmp_path
    settings.DEBUG = True  # as make studio runs it
    call_command("bootstrapdemo", stdout=io.StringIO())
    built = json.loads(demo_marker().read_text())
    page = owner_page
    page.goto("/training/new/")

    def suggested(label: str) -> list[str] | None:
        return page.get_by_label(label, exact=True).evaluate("el => el.list && [...el.list.options].map(o => o.value)")

    assert suggested("Base model") == [built["student"], built["teacher"]]
    assert suggested("Dataset") == [built["sft"], built["sft_text"], built["sft_prompt_completion"]]
    expect(page.get_by_label("Base model", exact=True)).to_have_accessible_description(re.compile(re.escape(built["student"])))
    page.get_by_label("Method").select_option("distill")
    expect(page.locator("#card-distill")).to_be_visible()
    assert suggested("Dataset") == [built["distill"]]
    # The dataset's help follows the picker too: its local example is DISTILL's demo dataset now.
    expect(page.get_by_label("Dataset", exact=True)).to_have_accessible_description(re.compile(re.escape(built["distill"])))
    assert page.locator("#f-dataset-help").count() == 1
    assert suggested("Teacher model") == [built["student"], built["teacher"]]
    page.shot("distill-suggestions")
