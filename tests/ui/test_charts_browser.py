"""Overview charts and the Checkpoints tab in a real browser: the y axis is wide enough for its labels and
its ticks tell apart values that differ past the third decimal, the step axis has whole steps only; a
merge is followed until it ends."""
from __future__ import annotations

import pytest
from playwright.sync_api import expect

from training import services
from training.models import MetricPoint

pytestmark = pytest.mark.django_db(transaction=True)

# The plot area starts where the y axis ends; the axis must hold its widest label (uPlot draws it
# right-aligned against the ticks, so a narrow axis cuts the leading digits: "0,000" for 10,000).
Y_AXIS_ROOM = """(label) => {
  const over = document.querySelector('#chart-1 .u-over');
  const ctx = document.createElement('canvas').getContext('2d');  // uPlot's default axis font
  ctx.font = '12px system-ui, -apple-system, "Segoe UI", Roboto, "Helvetica Neue", Arial, "Noto Sans", sans-serif';
  return {left: parseFloat(over.style.left), needed: ctx.measureText(label).width + 10};
}"""


def test_throughput_axis_labels_are_not_clipped(owner_page, project, users):
    page = owner_page
    run = services.create_run(project, users["owner"], name="fast", method="sft", base_model="org/base", dataset="my-data@main")
    MetricPoint.objects.bulk_create([MetricPoint(run=run, key=k, step=s, value=v) for s in range(1, 40)
                                     for k, v in (("loss", 2.0 / s), ("tokens_per_s", 100_000.0 + 1_000 * s))])
    page.goto(f"/training/runs/{run.pk}/")
    expect(page.locator("#chart-1")).to_have_attribute("data-drawn", "true")
    expect(page.locator('figure[data-chart="chart-1"] figcaption')).to_have_text("Throughput (tokens/s)")
    room = page.evaluate(Y_AXIS_ROOM, "140,000")
    assert room["left"] >= room["needed"], room
    page.shot("throughput")


# uPlot draws its tick labels on the canvas: record each chart's fillText calls (a redraw starts
# with clearRect, which starts the list again), with the alignment that tells the axes apart
# (the step axis' labels are centred under their ticks, the value axis' right-aligned).
RECORD_TICK_LABELS = """(() => {
  const drawn = new WeakMap();
  window.tickLabels = (id) => {
    const labels = drawn.get(document.querySelector('#' + id + ' canvas')) || [];
    const numbers = (align) => labels.filter(l => l.align === align && /\\d/.test(l.text)).map(l => l.text);
    return {steps: numbers('center'), values: numbers('right')};
  };
  const clear = CanvasRenderingContext2D.prototype.clearRect;
  CanvasRenderingContext2D.prototype.clearRect = function (...args) { drawn.set(this.canvas, []); return clear.apply(this, args); };
  const fill = CanvasRenderingContext2D.prototype.fillText;
  CanvasRenderingContext2D.prototype.fillText = function (text, ...args) {
    if (!drawn.has(this.canvas)) drawn.set(this.canvas, []);
    drawn.get(this.canvas).push({text: String(text), align: this.textAlign});
    return fill.call(this, text, ...args);
  };
})()"""


def test_tick_labels_tell_close_values_apart_and_steps_are_whole(owner_page, project, users):
    """A DPO loss that moves in the fourth decimal (0.69315 → 0.69275) used to read "0.693" on every
    value tick, and a two-step run had ticks at steps 1.2, 1.4, ..."""
    page = owner_page
    page.add_init_script(RECORD_TICK_LABELS)
    plateau = services.create_run(project, users["owner"], name="plateau", method="sft", base_model="org/base", dataset="my-data@main")
    MetricPoint.objects.bulk_create([MetricPoint(run=plateau, key="loss", step=s, value=0.69315 - 0.00001 * s) for s in range(1, 41)])
    short = services.create_run(project, users["owner"], name="short", method="sft", base_model="org/base", dataset="my-data@main")
    MetricPoint.objects.bulk_create([MetricPoint(run=short, key="loss", step=s, value=v) for s, v in ((1, 6.2337), (2, 6.2476))])

    page.goto(f"/training/runs/{plateau.pk}/")
    expect(page.locator("#chart-0")).to_have_attribute("data-drawn", "true")
    ticks = page.evaluate("tickLabels('chart-0')")
    assert len(set(ticks["values"])) == len(ticks["values"]) >= 2, ticks
    page.shot("plateau")
    # Exact too: a tick every 0.00025 reads 0.00025, 0.0005, ... (rounded to four decimals: 0.0003, 0.0005, 0.0008).
    for run, top in ((plateau, 0.00075), (short, 0.0009)):
        MetricPoint.objects.bulk_create([MetricPoint(run=run, key="tokens_per_s", step=s, value=top * s / 40) for s in range(1, 41)])
    for run in (plateau, short):
        page.goto(f"/training/runs/{run.pk}/")
        expect(page.locator("#chart-1")).to_have_attribute("data-drawn", "true")
        values = [float(v.replace(",", "")) for v in page.evaluate("tickLabels('chart-1')")["values"]]
        steps = {round(b - a, 12) for a, b in zip(values, values[1:], strict=False)}
        assert len(values) >= 2 and len(steps) == 1, values  # evenly spaced, as the ticks are

    page.goto(f"/training/runs/{short.pk}/")
    expect(page.locator("#chart-0")).to_have_attribute("data-drawn", "true")
    ticks = page.evaluate("tickLabels('chart-0')")
    assert ticks["steps"] == ["1", "2"], ticks
    assert len(set(ticks["values"])) == len(ticks["values"]) >= 2, ticks


def test_checkpoints_tab_follows_a_merge_until_it_ends(owner_page, project, users, tmp_path):
    from training import checkpoints
    from training.models import Checkpoint

    page = owner_page
    run = services.create_run(project, users["owner"], name="lora", method="sft", base_model="org/base", dataset="org/data", config={"lora_rank": 8})
    saved = Checkpoint.objects.create(run=run, attempt=1, step=3, kind="checkpoint", path=str(tmp_path / "checkpoint-3"))
    page.goto(f"/training/runs/{run.pk}/checkpoints/")
    page.get_by_role("button", name="Merge step 3").click()
    expect(page.get_by_test_id("merging-3")).to_have_text("Merging…")
    # The merge ends (the merged row as merge() records it; merge() itself clears the in-flight
    # mark, here by failing fast on a base model that is not on this machine): the table follows.
    Checkpoint.objects.create(run=run, attempt=1, step=3, kind="merged", path=str(tmp_path / "merged-step-3"))
    checkpoints.merge(saved.pk)
    expect(page.get_by_test_id("merged-3")).to_be_visible(timeout=15_000)
    expect(page.get_by_role("button", name="Merge step 3")).to_have_count(0)
    expect(page.locator('tr[data-checkpoint="merged-3"]')).to_be_visible()
    page.shot("merged")
