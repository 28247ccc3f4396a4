"""The rollout viewer's page (`viewer`): style and script inline, `{{title}}` and `{{data}}` filled by `viewer.page`.

The script only lays out what `viewer.page_data` computed: it filters the completions, searches them, and renders
one page of `PAGE_SIZE` at a time (so a file of 10,000 opens at once); `document.body.dataset.renderedMs` holds
`performance.now()` when the first page is on screen. Text goes into the page as text (`textContent`), never as HTML.
"""

PAGE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{{title}}</title>
<style>
  body { font: 14px/1.45 system-ui, sans-serif; margin: 0; background: #f4f5f7; color: #1d1f23; }
  header { position: sticky; top: 0; z-index: 1; background: #fff; border-bottom: 1px solid #d8dbe0;
           padding: .6rem 1rem; display: flex; flex-wrap: wrap; gap: .4rem 1.2rem; align-items: center; }
  header h1 { font-size: 1rem; margin: 0; overflow-wrap: anywhere; }
  header label { white-space: nowrap; }
  #search { width: 16rem; padding: .2rem .4rem; }
  #count { font-weight: 600; }
  main { padding: .8rem 1rem; }
  .completion { background: #fff; border: 1px solid #d8dbe0; border-radius: 6px; margin-bottom: .9rem;
                scroll-margin-top: 4rem; }
  .head { display: flex; flex-wrap: wrap; gap: .3rem .9rem; align-items: baseline; padding: .45rem .7rem;
          border-bottom: 1px solid #eceef1; }
  .label { font-weight: 600; }
  .badge { border-radius: 3px; padding: 0 .4rem; font-size: .85em; font-weight: 600; }
  .right { background: #dff3e4; color: #17632e; }
  .wrong { background: #fbe1e1; color: #9b1c1c; }
  .unknown { background: #eceef1; color: #555; }
  .split { background: #ffe9c7; color: #8a4b00; }
  .malformed { background: #efe3fb; color: #5b2a86; }
  .fact { color: #555; }
  details.prompt { padding: .3rem .7rem; color: #444; }
  .body { padding: .5rem .7rem; }
  .text, .path-body, .summary-body, details.prompt pre { white-space: pre-wrap; overflow-wrap: anywhere;
          font: 13px/1.45 ui-monospace, SFMono-Regular, Menlo, monospace; margin: 0; }
  .block { border: 1px solid #b9c3d3; border-radius: 5px; margin: .4rem 0; background: #f8fafd; }
  .block.split-block { border-color: #e0a040; }
  .block-head { padding: .2rem .5rem; font-size: .85em; color: #3b4a63; border-bottom: 1px solid #dde3ec; }
  .paths { display: grid; grid-auto-flow: column; grid-auto-columns: minmax(15rem, 1fr); gap: .4rem;
           padding: .4rem; overflow-x: auto; }
  .path { background: #fff; border: 1px solid #dde3ec; border-radius: 4px; min-width: 0; }
  .path-head { font-size: .85em; padding: .15rem .4rem; background: #eef2f8; color: #3b4a63; }
  .against { border-color: #e0a040; }
  .against > .path-head { background: #ffe9c7; color: #8a4b00; }
  .path-body { padding: .3rem .4rem; max-height: 22rem; overflow: auto; }
  .summary { margin: 0 .4rem .4rem; background: #fff; border: 1px dashed #b9c3d3; border-radius: 4px; }
  .summary-body { padding: .3rem .4rem; }
  nav { display: flex; gap: .6rem; align-items: center; padding: 0 1rem 1rem; }
  .empty { color: #666; padding: 1rem; }
</style>
</head>
<body>
<header>
  <h1 id="title"></h1>
  <span id="count"></span>
  <label><input type="checkbox" id="wrong"> wrong only (<span data-count="wrong"></span>)</label>
  <label><input type="checkbox" id="split"> split blocks (<span data-count="split"></span>)</label>
  <label><input type="checkbox" id="no_block"> no block (<span data-count="no_block"></span>)</label>
  <input type="search" id="search" placeholder="search prompts and completions">
</header>
<main id="list"></main>
<nav>
  <button id="previous">&lsaquo; previous</button><span id="page"></span><button id="next">next &rsaquo;</button>
</nav>
<script type="application/json" id="data">{{data}}</script>
<script>
"use strict";
const DATA = JSON.parse(document.getElementById("data").textContent);
const ALL = DATA.completions;
const PAGE_SIZE = 50;
const $ = (id) => document.getElementById(id);
let shown = ALL.map((_, i) => i), page = 0, haystack = null;

function el(tag, cls, text) {
  const node = document.createElement(tag);
  if (cls) node.className = cls;
  if (text !== undefined && text !== null) node.textContent = text;
  return node;
}

function nodeText(node) {
  if (!node.paths) return node.text;
  return node.paths.map((p) => p.text).join("\\n") + "\\n" + (node.summary || "");
}

function filter() {
  const wrong = $("wrong").checked, split = $("split").checked, noBlock = $("no_block").checked;
  const term = $("search").value.trim().toLowerCase();
  if (term && !haystack) {
    haystack = ALL.map((c) => (c.prompt + "\\n" + c.nodes.map(nodeText).join("\\n")).toLowerCase());
  }
  shown = [];
  ALL.forEach((c, i) => {
    if (wrong && c.correct !== false) return;
    if (split && !c.split) return;
    if (noBlock && c.blocks !== 0) return;
    if (term && !haystack[i].includes(term)) return;
    shown.push(i);
  });
  page = 0;
  render();
}

function block(node, number) {
  const box = el("div", "block" + (node.split ? " split-block" : ""));
  box.dataset.paths = node.paths.length;
  const head = el("div", "block-head", `block ${number}: ${node.paths.length} paths`);
  if (node.split) head.append(" ", el("span", "badge split", "split vote"));
  if (!node.closed) head.append(" ", el("span", "badge malformed", "not closed"));
  box.append(head);
  const paths = el("div", "paths");
  node.paths.forEach((p, i) => {
    const column = el("div", "path" + (p.against ? " against" : ""));
    const result = p.result === null ? "no number" : p.result;
    column.append(el("div", "path-head", `path ${i + 1} \\u2192 ${result}${p.closed ? "" : " (cut)"}`));
    column.append(el("div", "path-body", p.text));
    paths.append(column);
  });
  box.append(paths);
  if (node.summary !== null) {
    const summary = el("div", "summary");
    summary.append(el("div", "path-head", "summary"), el("div", "summary-body", node.summary));
    box.append(summary);
  }
  return box;
}

function card(c, index) {
  const box = el("article", "completion");
  box.dataset.index = index;
  const head = el("div", "head");
  head.append(el("span", "label", c.label || `completion ${index + 1}`));
  const verdict = c.correct === true ? "right" : c.correct === false ? "wrong" : "unknown";
  head.append(el("span", "badge " + verdict, verdict));
  head.append(el("span", "answer", "answer: " + (c.answer === null ? "none" : c.answer)));
  for (const [name, value] of Object.entries(c.facts)) {
    head.append(el("span", "fact", `${name}: ${value}`));
  }
  const tokens = c.tokens_total === null ? "tokens: -" : `D ${c.tokens_critical} of T ${c.tokens_total} tokens`;
  head.append(el("span", "fact tokens", tokens));
  if (c.split) head.append(el("span", "badge split", "split vote"));
  if (c.blocks === 0) head.append(el("span", "badge unknown", "no block"));
  if (c.error) head.append(el("span", "badge malformed", "malformed: " + c.error));
  box.append(head);
  if (c.prompt) {
    const prompt = el("details", "prompt");
    prompt.append(el("summary", null, "prompt"), el("pre", null, c.prompt));
    box.append(prompt);
  }
  const body = el("div", "body");
  let blocks = 0;
  for (const node of c.nodes) body.append(node.paths ? block(node, ++blocks) : el("div", "text", node.text));
  box.append(body);
  return box;
}

function render() {
  const pages = Math.max(1, Math.ceil(shown.length / PAGE_SIZE));
  const first = page * PAGE_SIZE;
  const cards = shown.slice(first, first + PAGE_SIZE).map((i) => card(ALL[i], i));
  $("list").replaceChildren(...(cards.length ? cards : [el("div", "empty", "no completion matches")]));
  $("count").textContent = `${shown.length} of ${ALL.length} completions`;
  $("count").dataset.shown = shown.length;
  $("page").textContent = `page ${page + 1} of ${pages}`;
  $("previous").disabled = page === 0;
  $("next").disabled = page + 1 >= pages;
}

$("title").textContent = DATA.title;
document.querySelectorAll("[data-count]").forEach((n) => { n.textContent = DATA.counts[n.dataset.count]; });
for (const id of ["wrong", "split", "no_block"]) $(id).addEventListener("change", filter);
let typing = null;
$("search").addEventListener("input", () => { clearTimeout(typing); typing = setTimeout(filter, 150); });
$("previous").addEventListener("click", () => { page -= 1; render(); window.scrollTo(0, 0); });
$("next").addEventListener("click", () => { page += 1; render(); window.scrollTo(0, 0); });
render();
document.body.dataset.renderedMs = performance.now();
</script>
</body>
</html>
"""
