"""The run's log page for a long log, in-process (Django's test client: middleware, view, template; not
the network): a running run with --lines lines of a training log (~110 characters each), and one of
--lines lines of 1,000 characters. For each: the page's size and render time, and once the page pages
(it showed up to 20,000 lines in one answer), "Load earlier lines" (htmx) and the follow poll with
nothing new (every 5 s per open page while the run reports).

    .venv/bin/python -m bench.log_page [--lines 20000] [--n 20]

Uses the bench database (DATABASE_URL, else studio_bench); its runs and their lines are deleted at the end.
"""
from __future__ import annotations

import argparse
import time

from bench.common import emit, fresh_project, setup_django, summary_ms

TRAINING_LINE = "{{'loss': {loss:.4f}, 'grad_norm': 1.{i:04d}, 'learning_rate': 1.99e-05, 'epoch': 0.{i:05d}, 'step': {i}, 'tokens_per_s': 5123.4}}"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--lines", type=int, default=20_000, help="log lines of each run")
    parser.add_argument("--n", type=int, default=20, help="timed requests of each kind")
    args = parser.parse_args()
    setup_django()
    from django.test import Client

    from training.models import LogLine, Status, TrainingRun
    from training.services import create_run

    project, user, _ = fresh_project("log-page")
    client = Client()
    client.force_login(user)
    logs = {"training_log": [TRAINING_LINE.format(loss=2.0 / (1 + i / 500), i=i) for i in range(args.lines)],
            "long_lines": [f"{i:06d} " + "x" * 993 for i in range(args.lines)]}
    figures: dict[str, dict] = {}
    runs = []
    try:
        for name, lines in logs.items():
            run = create_run(project, user, name=name, method="sft", base_model="org/base", dataset="org/data")
            runs.append(run)
            LogLine.objects.bulk_create([LogLine(run=run, attempt=1, line=line) for line in lines], batch_size=5000)
            TrainingRun.objects.filter(pk=run.pk).update(status=Status.RUNNING, attempt=1)
            page_url = f"/training/runs/{run.pk}/log"
            first, last = (LogLine.objects.filter(run=run).order_by(order).values_list("id", flat=True).first() for order in ("id", "-id"))
            html = client.get(page_url).content.decode()
            requests = {"page": (page_url, {})}
            if 'id="log-follow"' in html:  # a page that pages: the newest lines, earlier ones on request
                shown = html.split('id="full-log"')[1].split("</pre>")[0].count("\n")
                requests["load_earlier"] = (f"{page_url}?before={last - shown + 1}", {"HTTP_HX_REQUEST": "true"})
                requests["follow_poll"] = (f"{page_url}?after={last}", {"HTTP_HX_REQUEST": "true"})
            figures[name] = {"lines": len(lines), "log_chars": sum(map(len, lines)), "first_id": first}
            for kind, (url, headers) in requests.items():
                client.get(url, **headers)  # warm up
                seconds, size = [], 0
                for _ in range(args.n):
                    t0 = time.perf_counter()
                    response = client.get(url, **headers)
                    seconds.append(time.perf_counter() - t0)
                    assert response.status_code == 200, (url, response.status_code)
                    size = len(response.content)
                body = response.content.decode()
                box = body.split('id="full-log"')[1].split("</pre>")[0] if kind == "page" else body.split("<", 1)[0]  # htmx: the lines come first
                figures[name][kind] = {"bytes": size, "lines_in_answer": box.count("\n"), **summary_ms(seconds)}
    finally:
        for run in runs:
            run.delete()
    emit("log_page", figures, {"lines": args.lines, "requests": args.n, "client": "django.test.Client in-process, DEBUG=0",
                               "runs": {"training_log": "a running run's log of ~110-character lines",
                                        "long_lines": "a running run's log of 1,000-character lines"}})


if __name__ == "__main__":
    main()
