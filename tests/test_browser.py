"""The pages a person opens, loaded in headless Chromium (`browser.chromium_page`) and read as that person reads them.

- The trackio dashboard of the quick demo's runs (`quick_demos`, job "matched": its GRPO stages logged with
  `--report_to trackio`), served on localhost: it lists the `parallel/` metrics and its ratio plot holds the values
  the run logged (the plot's own CSV download); no request leaves the machine, from the page or the server.
- The rollout viewer of the same job's Parallel-R1 evaluation (`eval/parallel-r1/viewer.html`, opened from its file):
  every completion counted, each block with its paths as columns, the filters and the search show what they should;
  and a viewer of 10,000 made-up completions shows its first page within 2 s, as the page itself measures it. Neither
  page asks for anything but its own file.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from browser import chromium_page, screenshot
from tracking import dashboard, read_store, refused

from parallel_r1.evaluation.viewer import write_viewer
from parallel_r1.testing.completions import completion_records

DEMO_PROJECT = "parallel-r1-demo"


@pytest.mark.slow
@pytest.mark.timeout(1800)  # the first of the tests of the quick demo jobs waits for all of them
def test_the_trackio_dashboard_of_a_grpo_run_shows_its_parallel_metrics(quick_demos, free_port, tmp_path):
    out, done = quick_demos["matched"]
    assert done.returncode == 0, done.stdout[-3000:]
    metric = "train/parallel/ratio"
    logged = [
        entry[metric] for entry in read_store(out / "trackio", DEMO_PROJECT)["grpo"]["scalars"] if metric in entry
    ]
    assert logged
    port, outside = free_port(), []
    with dashboard(out / "trackio", DEMO_PROJECT, port, tmp_path / "network") as url, chromium_page() as page:
        local = f"http://127.0.0.1:{port}/"
        page.on(
            "request", lambda request: request.url.startswith((local, "data:", "blob:")) or outside.append(request.url)
        )
        page.goto(url)
        page.get_by_placeholder("e.g., loss|ndcg@10|gpu").fill("parallel/|reward$|sampling_logp_difference/mean")
        plot = page.locator(f'.plot-container[data-metric="{metric}"]')
        assert plot.locator(".plot-title").inner_text() == "ratio"
        screenshot(page, "trackio.png")
        assert {"grpo", "grpo-plain"} <= set(plot.locator(".legend-label").all_inner_texts())
        plot.scroll_into_view_if_needed()  # the dashboard draws a plot's controls once it is on screen
        with page.expect_download() as download:
            plot.locator('button[title^="Download this plot"][title$="data as a CSV file"]').click()
        rows = list(csv.DictReader(Path(download.value.path()).open()))
        assert [float(row[metric]) for row in rows if row["run"] == "grpo"] == pytest.approx(logged)
    assert outside == [] and refused(tmp_path / "network") == []


# the paths of each block of each completion on the page, in order
BLOCK_WIDTHS = """[...document.querySelectorAll("article.completion")].map(
    (card) => [...card.querySelectorAll(".block")].map((block) => block.querySelectorAll(".path").length))"""

INDICES = "(cards) => cards.map((card) => card.dataset.index)"  # which completions the page shows, in order


def shown(page) -> int:
    """How many completions the page says it shows (`#count`: "N of M completions")."""
    return int(page.locator("#count").get_attribute("data-shown"))


@pytest.mark.slow
@pytest.mark.timeout(1800)  # the first of the tests of the quick demo jobs waits for all of them
def test_the_viewer_of_an_evaluation_shows_its_completions_blocks_filters_and_search(quick_demos):
    out, done = quick_demos["matched"]
    assert done.returncode == 0, done.stdout[-3000:]
    folder = out / "eval" / "parallel-r1"
    records = [json.loads(line) for line in (folder / "completions.jsonl").read_text().splitlines()]
    count, outside = len(records), []
    with chromium_page() as page:
        page.on("request", lambda request: request.url.startswith("file://") or outside.append(request.url))
        page.goto((folder / "viewer.html").as_uri())
        assert page.locator("#count").inner_text() == f"{count} of {count} completions"
        assert page.locator("article.completion").count() == min(count, 50)
        # each block of each completion with as many columns as the record's shape counts paths (a quick run's
        # models may open few blocks, or none: the made-up 10,000 below hold many)
        assert page.evaluate(BLOCK_WIDTHS) == [r["paths_per_block"] for r in records[:50]]
        with_blocks = page.locator("article.completion:has(.block)")
        if with_blocks.count():
            with_blocks.first.evaluate("(card) => card.scrollIntoView()")
        screenshot(page, "viewer.png")
        page.check("#no_block")
        assert shown(page) == sum(r["blocks"] == 0 for r in records)
        page.check("#wrong")  # both must hold
        assert shown(page) == sum(r["blocks"] == 0 and not r["correct"] for r in records)
        page.uncheck("#no_block")
        page.uncheck("#wrong")
        term = records[-1]["prompt"]
        found = [i for i, r in enumerate(records) if term.lower() in (r["prompt"] + r["completion"]).lower()]
        page.fill("#search", term)
        page.wait_for_function(f"document.getElementById('count').dataset.shown == '{len(found)}'")
        assert [int(i) for i in page.locator("article.completion").evaluate_all(INDICES)] == found[:50]
        assert 0 < len(found) < count
    assert outside == []


@pytest.mark.slow
def test_a_viewer_of_10000_completions_shows_its_first_page_within_2_seconds(tmp_path):
    records = completion_records(10_000)
    path = write_viewer(records, tmp_path / "viewer.html", "10,000 made-up completions")
    with chromium_page() as page:
        page.goto(path.as_uri())
        page.locator("article.completion").first.wait_for()
        assert float(page.evaluate("document.body.dataset.renderedMs")) < 2000  # from the start of the navigation
        assert page.locator("#count").inner_text() == "10000 of 10000 completions"
        assert page.evaluate(BLOCK_WIDTHS) == [r["paths_per_block"] for r in records[:50]]
        page.click("#next")
        assert page.locator("#page").inner_text() == "page 2 of 200"
        assert page.locator("article.completion").first.get_attribute("data-index") == "50"
        page.check("#split")
        assert 0 < shown(page) == int(page.locator('[data-count="split"]').inner_text()) < 10_000
        page.uncheck("#split")
        term = records[123]["prompt"]
        found = [i for i, r in enumerate(records) if term.lower() in (r["prompt"] + r["completion"]).lower()]
        page.fill("#search", term.upper())  # the search ignores case
        page.wait_for_function(f"document.getElementById('count').dataset.shown == '{len(found)}'")
        assert [int(i) for i in page.locator("article.completion").evaluate_all(INDICES)] == found[:50]
