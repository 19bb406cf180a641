/*
 * Attention explorer: point at a word and see where a Transformer looks.
 *
 * Each attention head spreads one unit of weight from every query token
 * (the word that is looking) over the key tokens (the words looked at). This
 * page draws those weights for a few sample sentences, epoch by epoch:
 *
 *   - the head view (like bertviz): queries on the left, keys on the right,
 *     one line per (query, key) pair, as opaque as its weight, coloured by
 *     head. Hovering a token keeps only its lines; a click pins it.
 *   - the matrix view: one heatmap per head, rows = queries, columns = keys.
 *
 * The data comes in two shapes:
 *
 *   INDEX  = {"runs": [{"run": "samples", "samples": [{"sample": 0,
 *             "label": "Ein Hund läuft.", "steps": [1, 2, 3],
 *             "kinds": {"cross": [0, 1], ...}}]}]}          (kind -> layers)
 *   SAMPLE = {"run", "sample", "step", "texts": {"source": "...", ...},
 *             "maps": [{"kind", "layer", "queries": [...], "keys": [...],
 *                       "sides": [query side, key side], "weights": heads x queries x keys}]}
 *
 * and from one of two sources:
 *
 *   - embedded: a saved HTML page (`explorer_html` in Python) holds all of it
 *     as JSON in <script id="attention-data">; <body data-attention-explorer=
 *     "embedded">. Works offline from a file.
 *   - fetch: inside TensorBoard (which calls `render()`) or on the standalone
 *     page explorer.html (<body data-attention-explorer="fetch">), the plugin
 *     answers `index` and `sample?run=..&sample=..&step=..` (relative URLs).
 *
 * The selection lives in the URL hash (#run=..&sample=..&step=..&kind=..
 * &layer=..&heads=0,2&view=head), so a view can be bookmarked and shared.
 * No framework, no build step, nothing fetched from the internet.
 */

// ---------------------------------------------------------------------------
// Constants
// ---------------------------------------------------------------------------

// A fixed qualitative palette: head h is always the same colour.
const HEAD_COLORS = [
  "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b",
  "#e377c2", "#17becf", "#bcbd22", "#7f7f7f", "#393b79", "#843c39",
];

const KIND_NAMES = {
  encoder: "encoder self-attention",
  decoder_self: "decoder self-attention",
  cross: "cross-attention",
  cls: "[CLS] attention",
  pooling: "attention pooling (token weights)",
};

// What the two columns of the head view are, per kind.
const COLUMN_TITLES = {
  encoder: ["queries (source)", "keys (source)"],
  decoder_self: ["queries (target)", "keys (target)"],
  cross: ["queries (target)", "keys (source)"],
  cls: ["query", "keys (sentence)"],
  pooling: ["pooled vector", "tokens (sentence)"],
};

// A map's column titles: its kind's, naming the sides the map says its tokens
// are from (a language model's decoder self-attention is over "text", not "target").
function columnTitles(map) {
  const titles = COLUMN_TITLES[map.kind] ?? ["queries", "keys"];
  if (!map.sides) return titles;
  return titles.map((title, axis) => title.replace(/\((source|target)\)/, `(${map.sides[axis]})`));
}

const MIN_LINK_WEIGHT = 0.01;   // lighter lines would be invisible anyway
const MAX_TOKEN_CHARS = 24;     // longer tokens are cut, with "…"
const MAX_AXIS_CHARS = 14;      // the same on a heatmap's axes, which are tighter
const CHAR_WIDTH = 7.5;         // rough width of a 13px character, for layout
const ROW_HEIGHT = 22;          // head view: pixels per token
const HEAD_VIEW_TOP = 44;       // head view: room for the column titles
const LINK_AREA_WIDTH = 280;    // head view: gap between the two columns
const WEIGHT_LABEL_WIDTH = 32;  // head view: room for one "0.42" per head
const MATRIX_SIZE = 380;        // matrix view: target side of a heatmap, px
const SVG_NS = "http://www.w3.org/2000/svg";

// ---------------------------------------------------------------------------
// State: what is selected, and what the page is showing
// ---------------------------------------------------------------------------

const state = {
  run: null, sample: null, step: null, kind: null, layer: null,
  heads: null,        // selected head numbers; null = all (until we know how many)
  view: "head",       // "head" or "matrix"
  focus: null,        // head view: {side: "query"|"key", index} under the pointer
  pinned: false,      // whether a click fixed the focus
};

let source = null;          // where INDEX and SAMPLE come from (see below)
let index = null;           // the INDEX
let page = null;            // the page's elements, by role
let currentMap = null;      // the attention map on screen
let headLayout = null;      // head view geometry, for the weight labels
let refreshCount = 0;       // to drop answers to selections that changed since
let mounted = false;
const sampleCache = new Map();   // "run\0sample\0step" -> Promise of SAMPLE

// ---------------------------------------------------------------------------
// Small DOM helpers
// ---------------------------------------------------------------------------

function setAttributes(element, attributes) {
  for (const [name, value] of Object.entries(attributes)) {
    if (value !== null && value !== undefined) element.setAttribute(name, String(value));
  }
  return element;
}

function html(tag, attributes = {}, ...children) {
  const element = setAttributes(document.createElement(tag), attributes);
  element.append(...children);
  return element;
}

function svg(tag, attributes = {}, ...children) {
  const element = setAttributes(document.createElementNS(SVG_NS, tag), attributes);
  element.append(...children);
  return element;
}

const range = (n) => Array.from({ length: n }, (_, i) => i);
const headColor = (head) => HEAD_COLORS[head % HEAD_COLORS.length];
const kindName = (kind) => KIND_NAMES[kind] ?? kind;
const shortToken = (token, maxChars = MAX_TOKEN_CHARS) =>
  token.length > maxChars ? token.slice(0, maxChars - 1) + "…" : token;

// Width that the longest token of a column needs (an estimate: the layout is
// computed before the text is drawn).
function tokenColumnWidth(tokens, charWidth = CHAR_WIDTH, maxChars = MAX_TOKEN_CHARS) {
  const longest = Math.max(1, ...tokens.map((token) => Math.min(maxChars, token.length)));
  return longest * charWidth + 12;
}

// ---------------------------------------------------------------------------
// Data sources: both offer loadIndex() and loadSample(), returning promises
// ---------------------------------------------------------------------------

const sampleKey = (run, sample, step) => `${run}\u0000${sample}\u0000${step}`;

// Everything is in the page, as JSON written by Python's explorer_html().
function embeddedSource() {
  let data = null;
  const read = () => {
    if (data === null) {
      const script = document.getElementById("attention-data");
      if (!script) throw new Error("this page has no #attention-data");
      data = JSON.parse(script.textContent);
    }
    return data;
  };
  return {
    loadIndex: async () => read().index,
    loadSample: async (run, sample, step) => {
      const found = read().samples[sampleKey(run, sample, step)];
      if (!found) throw new Error(`no data for run ${run}, sample ${sample}, epoch ${step}`);
      return found;
    },
    // A shared link opens this same file.
    shareBase: () => location.href.split("#")[0],
  };
}

// The TensorBoard plugin answers relative URLs (the page's <base> points at it).
function fetchSource() {
  return {
    loadIndex: () => fetchJson("index"),
    loadSample: (run, sample, step) => fetchJson("sample?" + new URLSearchParams({ run, sample, step })),
    // A shared link opens the standalone page, outside TensorBoard's frames.
    shareBase: () => new URL("explorer.html", document.baseURI).href,
  };
}

async function fetchJson(url) {
  const response = await fetch(url);
  if (!response.ok) throw new Error(`${url}: HTTP ${response.status} ${response.statusText}`);
  return response.json();
}

// Each sample is loaded once: moving the slider back and forth is instant.
function loadSample(run, sample, step) {
  const key = sampleKey(run, sample, step);
  if (!sampleCache.has(key)) {
    const pending = source.loadSample(run, sample, step);
    pending.catch(() => sampleCache.delete(key));   // a failed load may be retried
    sampleCache.set(key, pending);
  }
  return sampleCache.get(key);
}

// ---------------------------------------------------------------------------
// Mounting: build the page once, load the index, show the first selection
// ---------------------------------------------------------------------------

async function mount(newSource) {
  if (mounted || document.getElementById("attention-explorer")) return;
  mounted = true;
  source = newSource;
  page = buildPage(document.body);
  try {
    index = await source.loadIndex();
  } catch (error) {
    fail("Could not load the list of runs", error);
    return;
  }
  index.runs = (index.runs ?? []).filter((run) => run.samples?.length);
  if (!index.runs.length) {
    showStatus("No attention maps yet: they appear once training has logged an epoch.");
    return;
  }
  Object.assign(state, selectionFromHash());
  // Editing the address by hand (replaceState below fires no hashchange).
  window.addEventListener("hashchange", () => {
    Object.assign(state, selectionFromHash());
    refresh();
  });
  await refresh();
}

// TensorBoard imports this module and calls render() in the plugin's frame.
export async function render() {
  if (!document.getElementById("attention-explorer-style")) {
    document.head.append(html("link", { id: "attention-explorer-style", rel: "stylesheet", href: "explorer.css" }));
  }
  await mount(fetchSource());
}

function showStatus(message) {
  page.status.textContent = message;
}

// Genuine failures: a line on the page, the details in the console.
function fail(message, error) {
  showStatus(`${message}: ${error.message ?? error}`);
  console.error(message, error);
}

// The page's skeleton. Controls keep their identity across refreshes (so that
// dragging the slider is not interrupted); only their options change.
function buildPage(parent) {
  const select = (id) => html("select", { id });
  const elements = {
    run: select("run"),
    sample: select("sample"),
    step: html("input", { id: "step", type: "range", min: 0, max: 0, step: 1, value: 0 }),
    stepLabel: html("span", { id: "step-label" }, "epoch"),
    kind: select("kind"),
    layer: select("layer"),
    heads: html("span", { id: "heads" }),
    allHeads: html("button", { id: "heads-all", type: "button" }, "all"),
    noHeads: html("button", { id: "heads-none", type: "button" }, "none"),
    viewHead: html("button", { id: "view-head", type: "button" }, "head view"),
    viewMatrix: html("button", { id: "view-matrix", type: "button" }, "matrix view"),
    // A new tab: inside TensorBoard the link would otherwise open in the plugin's frame.
    share: html("a", { id: "share-link", href: "#", target: "_blank", rel: "noopener" }, "link to this view"),
    status: html("p", { id: "status", role: "status" }),
    texts: html("table", { id: "texts" }),
    hint: html("p", { class: "hint" }),
    headView: svg("svg", { id: "head-view", role: "img", "aria-label": "attention lines between tokens" }),
    matrixView: html("div", { id: "matrix-view", hidden: "" }),
  };
  const labelled = (text, control) => html("label", {}, html("span", { class: "control-name" }, text), control);
  const root = html("div", { id: "attention-explorer" },
    html("div", { class: "toolbar" },
      labelled("run", elements.run),
      labelled("sample", elements.sample),
      html("label", { class: "step" }, elements.step, elements.stepLabel),
      labelled("attention", elements.kind),
      labelled("layer", elements.layer)),
    html("div", { class: "toolbar" },
      html("span", { class: "control-name" }, "heads"), elements.heads,
      html("span", { class: "head-buttons" }, elements.allHeads, elements.noHeads),
      html("span", { class: "spacer" }),
      html("span", { class: "view-switch" }, elements.viewHead, elements.viewMatrix),
      elements.share),
    elements.status,
    elements.texts,
    elements.hint,
    html("div", { class: "views" }, elements.headView, elements.matrixView));
  parent.append(root);
  wireControls(elements);
  return elements;
}

// ---------------------------------------------------------------------------
// Controls: each change updates `state`, then the page follows
// ---------------------------------------------------------------------------

function wireControls(elements) {
  elements.run.addEventListener("change", () => { state.run = elements.run.value; refresh(); });
  elements.sample.addEventListener("change", () => { state.sample = elements.sample.value; refresh(); });
  elements.step.addEventListener("input", () => {
    state.step = currentSampleEntry().steps[Number(elements.step.value)];
    refresh();
  });
  elements.kind.addEventListener("change", () => { state.kind = elements.kind.value; refresh(); });
  elements.layer.addEventListener("change", () => { state.layer = Number(elements.layer.value); refresh(); });
  elements.heads.addEventListener("change", () => {
    const checked = elements.heads.querySelectorAll("input.head-toggle:checked");
    setHeads([...checked].map((toggle) => Number(toggle.dataset.head)));
  });
  elements.allHeads.addEventListener("click", () => setHeads(range(currentMap?.weights.length ?? 0)));
  elements.noHeads.addEventListener("click", () => setHeads([]));
  elements.viewHead.addEventListener("click", () => setView("head"));
  elements.viewMatrix.addEventListener("click", () => setView("matrix"));
  // A click beside the tokens lets go of a pinned token.
  elements.headView.addEventListener("click", () => {
    if (state.pinned) { state.pinned = false; setFocus(null); }
  });
}

// Heads and view change the drawing, not the data: no reload.
function setHeads(heads) {
  if (!currentMap) return;
  state.heads = heads;
  showHeadToggles(currentMap.weights.length);
  writeHash();
  drawCurrentView();
}

function setView(view) {
  state.view = view;
  writeHash();
  drawCurrentView();
}

function currentSampleEntry() {
  const run = index.runs.find((entry) => entry.run === state.run);
  return run.samples.find((entry) => String(entry.sample) === String(state.sample));
}

// The wanted value if it is one of the options, else the fallback. Values
// from the URL are strings, so numbers are compared as numbers.
function pickNumber(wanted, options, fallback) {
  const number = wanted === null || wanted === "" ? NaN : Number(wanted);
  return options.includes(number) ? number : fallback;
}

// The kinds a sample has, in the order encoder, decoder, cross, [CLS], pooling.
function sampleKinds(entry) {
  const order = Object.keys(KIND_NAMES);
  const rank = (kind) => (order.includes(kind) ? order.indexOf(kind) : order.length);
  return Object.keys(entry.kinds).sort((a, b) => rank(a) - rank(b));
}

// Turns whatever is in `state` into a valid selection for the index: keeps
// what exists (so changing the epoch keeps the kind, layer and heads), falls
// back to the first run and sample, the last epoch, cross-attention, the last
// layer.
function normalizeSelection() {
  const run = index.runs.find((entry) => entry.run === state.run) ?? index.runs[0];
  const sample = run.samples.find((entry) => String(entry.sample) === String(state.sample)) ?? run.samples[0];
  const kinds = sampleKinds(sample);
  state.run = run.run;
  state.sample = sample.sample;
  state.step = pickNumber(state.step, sample.steps, sample.steps.at(-1));
  state.kind = kinds.includes(state.kind) ? state.kind : kinds.includes("cross") ? "cross" : kinds[0];
  const layers = sample.kinds[state.kind] ?? [];   // a sample logged with no maps has no kinds
  state.layer = pickNumber(state.layer, layers, layers.at(-1));
  state.view = state.view === "matrix" ? "matrix" : "head";
  return { run, sample };
}

// Heads that exist in this map; all of them when none of the wanted ones do.
function normalizeHeads(heads, headCount) {
  if (heads === null) return range(headCount);
  const valid = heads.filter((head) => head < headCount);
  return valid.length || !heads.length ? valid : range(headCount);
}

function fillSelect(select, options, selected) {
  select.replaceChildren(...options.map(([value, text]) => html("option", { value }, text)));
  select.value = String(selected);
}

function showControls(run, sample) {
  fillSelect(page.run, index.runs.map((entry) => [entry.run, entry.run]), state.run);
  fillSelect(page.sample, run.samples.map((entry) => [entry.sample, entry.label ?? `sample ${entry.sample}`]), state.sample);
  page.step.max = sample.steps.length - 1;
  page.step.value = sample.steps.indexOf(state.step);
  page.step.disabled = sample.steps.length < 2;
  page.stepLabel.textContent = `epoch ${state.step}`;
  fillSelect(page.kind, sampleKinds(sample).map((kind) => [kind, kindName(kind)]), state.kind);
  fillSelect(page.layer, (sample.kinds[state.kind] ?? []).map((layer) => [layer, `layer ${layer}`]), state.layer);
}

// One checkbox per head with its colour; rebuilt only when the count changes.
function showHeadToggles(headCount) {
  if (page.heads.querySelectorAll("input.head-toggle").length !== headCount) {
    page.heads.replaceChildren(...range(headCount).map((head) => {
      const swatch = html("span", { class: "swatch" });
      swatch.style.backgroundColor = headColor(head);
      return html("label", { class: "head" },
        html("input", { type: "checkbox", class: "head-toggle", "data-head": head }), swatch, `${head}`);
    }));
  }
  for (const toggle of page.heads.querySelectorAll("input.head-toggle")) {
    toggle.checked = state.heads.includes(Number(toggle.dataset.head));
  }
}

function showTexts(texts) {
  page.texts.replaceChildren(...Object.entries(texts ?? {}).map(([name, text]) =>
    html("tr", {}, html("th", {}, name), html("td", {}, String(text)))));
}

// Brings the whole page in line with `state`: controls, URL, data, drawing.
async function refresh() {
  const thisRefresh = ++refreshCount;
  const { run, sample } = normalizeSelection();
  showControls(run, sample);
  writeHash();
  let sampleData;
  try {
    sampleData = await loadSample(state.run, state.sample, state.step);
  } catch (error) {
    if (thisRefresh === refreshCount) fail(`Could not load epoch ${state.step}`, error);
    return;
  }
  if (thisRefresh !== refreshCount) return;   // the selection changed meanwhile
  showStatus("");
  showTexts(sampleData.texts);
  currentMap = (sampleData.maps ?? []).find((map) => map.kind === state.kind && map.layer === state.layer) ?? null;
  if (!currentMap) {
    showStatus(`Epoch ${state.step} has no ${kindName(state.kind)} for layer ${state.layer}.`);
    page.headView.replaceChildren();
    page.matrixView.replaceChildren();
    return;
  }
  state.heads = normalizeHeads(state.heads, currentMap.weights.length);
  showHeadToggles(currentMap.weights.length);
  writeHash();
  drawCurrentView();
}

// Shows one view, draws it, and empties the other.
function drawCurrentView() {
  const showHead = state.view === "head";
  page.viewHead.classList.toggle("active", showHead);
  page.viewMatrix.classList.toggle("active", !showHead);
  page.headView.toggleAttribute("hidden", !showHead);
  page.matrixView.toggleAttribute("hidden", showHead);
  page.hint.textContent = showHead
    ? "Point at a token to see where it attends (or what attends to it); click to pin it."
    : "Each row is a query token, each column a key token; hover a cell for its weight.";
  if (!currentMap) return;
  if (showHead) {
    page.matrixView.replaceChildren();
    drawHeadView(currentMap);
  } else {
    page.headView.replaceChildren();
    drawMatrixView(currentMap);
  }
}

// ---------------------------------------------------------------------------
// Head view: two columns of tokens joined by one line per head and weight
// ---------------------------------------------------------------------------

function drawHeadView(map) {
  const { queries, keys, weights } = map;
  const heads = state.heads;
  const rows = Math.max(queries.length, keys.length);
  const labelWidth = Math.max(1, heads.length) * WEIGHT_LABEL_WIDTH;
  const queryWidth = tokenColumnWidth(queries);
  const keyWidth = tokenColumnWidth(keys);
  const queryRight = labelWidth + queryWidth;       // query tokens end here
  const keyLeft = queryRight + LINK_AREA_WIDTH;       // key tokens start here
  const width = keyLeft + keyWidth + labelWidth;
  const height = HEAD_VIEW_TOP + rows * ROW_HEIGHT + 8;
  // The shorter column is centred (one [CLS] query fans out to all keys).
  const rowCenter = (count) => (i) => HEAD_VIEW_TOP + ((rows - count) / 2 + i + 0.5) * ROW_HEIGHT;
  const queryY = rowCenter(queries.length);
  const keyY = rowCenter(keys.length);
  headLayout = { queryY, keyY, queryOuterX: queryRight - queryWidth, keyOuterX: keyLeft + keyWidth };

  // Heads side by side would hide each other: each is shifted a little.
  const headShift = Math.min(2, (ROW_HEIGHT * 0.5) / Math.max(1, heads.length));
  const links = svg("g", { class: "links" });
  heads.forEach((head, position) => {
    const shift = (position - (heads.length - 1) / 2) * headShift;
    weights[head].forEach((row, i) => row.forEach((weight, j) => {
      if (weight <= MIN_LINK_WEIGHT) return;
      links.append(svg("line", {
        class: "link", "data-head": head, "data-query": i, "data-key": j, "data-state": "normal",
        x1: queryRight + 6, y1: queryY(i) + shift, x2: keyLeft - 6, y2: keyY(j) + shift,
        stroke: headColor(head), "stroke-width": 2, "stroke-opacity": (Math.min(1, weight) * 0.9).toFixed(3),
      }));
    }));
  });

  const [queryTitle, keyTitle] = columnTitles(map);
  const tokens = svg("g", { class: "tokens" },
    ...queries.map((token, i) => tokenText(token, "query", i, queryRight, queryY(i), "end")),
    ...keys.map((token, j) => tokenText(token, "key", j, keyLeft, keyY(j), "start")));
  page.headView.replaceChildren(
    svg("text", { class: "column-title", x: queryRight, y: 20, "text-anchor": "end" }, queryTitle),
    svg("text", { class: "column-title", x: keyLeft, y: 20, "text-anchor": "start" }, keyTitle),
    links, tokens, svg("g", { class: "weight-labels" }));
  setAttributes(page.headView, { width, height, viewBox: `0 0 ${width} ${height}` });

  // A pinned token stays pinned across epochs, so its lines can be followed.
  const focus = state.focus;
  const count = focus?.side === "query" ? queries.length : keys.length;
  if (state.pinned && focus.index < count) setFocus(focus);
  else { state.pinned = false; setFocus(null); }
}

function tokenText(token, side, index, x, y, anchor) {
  const text = svg("text", {
    class: "token", "data-side": side, "data-index": index, "data-token": token,
    x, y, "text-anchor": anchor, "dominant-baseline": "middle", tabindex: 0,
  }, shortToken(token));
  const here = { side, index };
  text.addEventListener("mouseenter", () => { if (!state.pinned) setFocus(here); });
  text.addEventListener("mouseleave", () => { if (!state.pinned) setFocus(null); });
  text.addEventListener("click", (event) => { event.stopPropagation(); togglePin(here); });
  text.addEventListener("keydown", (event) => {
    if (event.key === "Enter" || event.key === " ") { event.preventDefault(); togglePin(here); }
  });
  return text;
}

// A click pins a token; a second click on it lets go; a click on another
// token moves the pin there.
function togglePin(token) {
  const same = state.focus?.side === token.side && state.focus?.index === token.index;
  state.pinned = !(state.pinned && same);
  setFocus(token);
}

// Keeps only the lines of the focused token (all lines when focus is null).
function setFocus(focus) {
  state.focus = focus;
  const end = focus?.side === "query" ? "query" : "key";   // which end of a line to match
  for (const line of page.headView.querySelectorAll("line.link")) {
    line.dataset.state = focus === null ? "normal"
      : Number(line.dataset[end]) === focus.index ? "highlighted" : "hidden";
  }
  for (const token of page.headView.querySelectorAll("text.token")) {
    const focused = focus !== null && token.dataset.side === focus.side && Number(token.dataset.index) === focus.index;
    token.classList.toggle("focused", focused);
    token.classList.toggle("pinned", focused && state.pinned);
  }
  showFocusedWeights(focus);
}

// Beside each token at the other end of the focused token's lines, the weight
// of each line, in its head's colour: one column of numbers per head.
function showFocusedWeights(focus) {
  const group = page.headView.querySelector("g.weight-labels");
  if (!group) return;
  group.replaceChildren();
  if (focus === null || !currentMap) return;
  const fromQuery = focus.side === "query";
  const others = fromQuery ? currentMap.keys.length : currentMap.queries.length;
  // Right of the keys, or left of the queries.
  const firstColumnX = fromQuery ? headLayout.keyOuterX : headLayout.queryOuterX - state.heads.length * WEIGHT_LABEL_WIDTH;
  state.heads.forEach((head, column) => {
    for (let other = 0; other < others; other++) {
      const weight = fromQuery ? currentMap.weights[head][focus.index][other] : currentMap.weights[head][other][focus.index];
      if (weight <= MIN_LINK_WEIGHT) continue;   // no line, no number
      group.append(svg("text", {
        class: "weight", "data-head": head, fill: headColor(head), "dominant-baseline": "middle",
        x: firstColumnX + column * WEIGHT_LABEL_WIDTH + 4, y: (fromQuery ? headLayout.keyY : headLayout.queryY)(other),
      }, weight.toFixed(2)));
    }
  });
}

// ---------------------------------------------------------------------------
// Matrix view: one heatmap per selected head
// ---------------------------------------------------------------------------

function drawMatrixView(map) {
  page.matrixView.replaceChildren(...state.heads.map((head) => matrixPanel(map, head)));
}

// White for weight 0, the head's colour for weight 1.
function mixWithWhite(hexColor, weight) {
  const amount = Math.min(1, Math.max(0, weight));
  const channels = [1, 3, 5].map((start) => parseInt(hexColor.slice(start, start + 2), 16));
  const mixed = channels.map((channel) => Math.round(255 + (channel - 255) * amount));
  return `rgb(${mixed.join(",")})`;
}

function matrixPanel(map, head) {
  const { queries, keys } = map;
  const weights = map.weights[head];
  const color = headColor(head);
  const cell = Math.max(10, Math.min(24, Math.floor(MATRIX_SIZE / Math.max(queries.length, keys.length))));
  const charWidth = 6.5;   // the axis labels are 11px
  const longestKey = Math.min(MAX_AXIS_CHARS, Math.max(1, ...keys.map((key) => key.length))) * charWidth;
  const left = tokenColumnWidth(queries, charWidth, MAX_AXIS_CHARS);
  const top = longestKey * Math.sin(Math.PI / 3) + 10;   // keys are rotated 60°
  const width = left + keys.length * cell + longestKey * 0.5 + 8;
  const height = top + queries.length * cell + 4;

  const cells = svg("g", { class: "cells" });
  weights.forEach((row, i) => row.forEach((weight, j) => {
    cells.append(svg("rect", {
      class: "cell", "data-query": i, "data-key": j,
      x: left + j * cell, y: top + i * cell, width: cell, height: cell, fill: mixWithWhite(color, weight),
    }, svg("title", {}, `${queries[i]} -> ${keys[j]}: ${weight.toFixed(3)}`)));
  }));
  const frame = svg("rect", {
    class: "frame", x: left, y: top, width: keys.length * cell, height: queries.length * cell,
  });
  const heatmap = svg("svg", { class: "matrix", width, height, viewBox: `0 0 ${width} ${height}` }, cells, frame);
  queries.forEach((token, i) => heatmap.append(axisLabel(heatmap, token, "query", i, {
    x: left - 4, y: top + (i + 0.5) * cell, "text-anchor": "end", "dominant-baseline": "middle",
  })));
  keys.forEach((token, j) => {
    const x = left + (j + 0.5) * cell;
    const y = top - 4;
    heatmap.append(axisLabel(heatmap, token, "key", j, { x, y, transform: `rotate(-60 ${x} ${y})` }));
  });

  const title = html("h3", {}, html("span", { class: "swatch" }), `head ${head}`);
  title.style.color = color;
  title.firstChild.style.backgroundColor = color;
  return html("div", { class: "matrix-panel", "data-head": head }, title, heatmap, colorScale(color));
}

// A row or column label; hovering it fades the other rows or columns.
function axisLabel(heatmap, token, side, index, attributes) {
  const label = svg("text", { class: "axis-label", "data-side": side, "data-index": index, ...attributes },
    shortToken(token, MAX_AXIS_CHARS));
  label.addEventListener("mouseenter", () => highlightMatrixLine(heatmap, side, index));
  label.addEventListener("mouseleave", () => highlightMatrixLine(heatmap, null, null));
  return label;
}

function highlightMatrixLine(heatmap, side, index) {
  for (const cell of heatmap.querySelectorAll("rect.cell")) {
    cell.classList.toggle("dim", side !== null && Number(cell.dataset[side]) !== index);
  }
  for (const label of heatmap.querySelectorAll("text.axis-label")) {
    label.classList.toggle("focused", label.dataset.side === side && Number(label.dataset.index) === index);
  }
}

// The legend: 0 is white, 1 the head's colour. A CSS gradient, so that no
// SVG id (which TensorBoard's <base href> would break) is needed.
function colorScale(color) {
  const bar = html("span", { class: "bar" });
  bar.style.backgroundImage = `linear-gradient(to right, #fff, ${color})`;
  return html("div", { class: "color-scale" }, html("span", {}, "0"), bar, html("span", {}, "1"), html("span", { class: "what" }, "weight"));
}

// ---------------------------------------------------------------------------
// URL state: the selection in the hash, and the share link
// ---------------------------------------------------------------------------

function selectionFromHash() {
  const params = new URLSearchParams(location.hash.replace(/^#/, ""));
  const heads = (params.get("heads") ?? "").split(",").filter((part) => /^\d+$/.test(part)).map(Number);
  return {
    run: params.get("run"), sample: params.get("sample"), step: params.get("step"),
    kind: params.get("kind"), layer: params.get("layer"),
    heads: heads.length ? heads : null, view: params.get("view"),
    focus: null, pinned: false,
  };
}

function selectionHash() {
  const params = new URLSearchParams({
    run: state.run, sample: state.sample, step: state.step, kind: state.kind, layer: state.layer,
  });
  if (state.heads !== null) params.set("heads", state.heads.join(","));
  params.set("view", state.view);
  return params.toString().replaceAll("%2C", ",");   // heads=0,2 reads better than 0%2C2
}

// replaceState, not a new history entry: the back button leaves the page.
// The full address, because a bare "#..." would be resolved against the
// <base href> of TensorBoard's plugin frame, not against this page.
function writeHash() {
  const hash = "#" + selectionHash();
  history.replaceState(history.state, "", location.href.split("#")[0] + hash);
  page.share.href = source.shareBase() + hash;
}

// ---------------------------------------------------------------------------
// Start: a saved page, or the standalone page of the plugin, mounts itself
// ---------------------------------------------------------------------------

const pageMode = document.body?.dataset.attentionExplorer;
if (pageMode === "embedded") mount(embeddedSource());
else if (pageMode === "fetch") render();
