// A run in the browser, offline: the page `keras-transformer export RUN OUT --format web` writes.
//
// model.tflite is a LiteRT file of builtin operators with the search inside: pieces in, ids out
// (`--ops builtin`, with inputs of one shape: LiteRT.js runs no other). LiteRT.js runs it on
// WebAssembly; each side's tokenizer runs from the files beside it (tokenizers.js: Hugging Face's
// tokenizers port, or SentencePiece's WebAssembly build), as `keras_transformer.on_device` does in
// Python with the same files and the same litert.json.
//
// `?text=` (lines separated by newlines) is answered at once, one line of #translations a line:
// a translation, `label<TAB>probability` (as `keras-transformer classify` prints it), or the
// continued text. When an answer is written, <body data-state> is "done" ("failed" if the model
// could not load); data-load-ms and data-first-ms say how long loading and the first answer took.

import {loadAndCompile, loadLiteRt, Tensor} from "@litertjs/core";
import {loadTokenizer} from "./tokenizers.js";

const element = (id) => document.getElementById(id);
const VERBS = {translation: "Translate", classification: "Classify", language_model: "Continue"};

async function fetchOk(path) {
  const response = await fetch(path);
  if (!response.ok) throw new Error(`${path} could not be read (${response.status})`);
  return response;
}

async function fetchJson(path) {
  return (await fetchOk(path)).json();
}

async function load() {
  const settings = await fetchJson("litert.json");
  await loadLiteRt(new URL("vendor/litertjs-core/wasm/", location.href).href);
  const model = await loadAndCompile(new URL("model.tflite", location.href).href, {accelerator: "wasm"});
  const read = {json: fetchJson, bytes: async (path) => new Uint8Array(await (await fetchOk(path)).arrayBuffer())};
  const tokenizers = {};
  for (const [name, recorded] of Object.entries(settings.tokenizers)) {
    // A translation reads the source and writes the target; a classifier only reads; a language model both.
    const uses = {encodes: name !== "target", decodes: name === "target" || settings.kind === "language_model"};
    tokenizers[name] = await loadTokenizer(recorded, read, uses);
  }
  return {settings, model, tokenizers};
}

// A text's pieces as the file's one input row: the first `width` (a prompt's last), 0 after them.
function piecesRow(ids, width, lastOnes) {
  const row = new Int32Array(width);
  row.set(lastOnes ? ids.slice(-width) : ids.slice(0, width));
  return new Tensor(row, [1, width]);
}

// Runs a signature; every tensor made or returned is freed (LiteRT.js leaves memory to its caller).
async function run(model, inputs) {
  try {
    const outputs = await model.run("serving_default", inputs);
    const arrays = {};
    for (const [name, tensor] of Object.entries(outputs)) {
      arrays[name] = Array.from(tensor.toTypedArray());
      tensor.delete();
    }
    return arrays;
  } finally {
    Object.values(inputs).forEach((tensor) => tensor.delete());
  }
}

// One line's answer, as the command line answers it: a blank line is answered blank
// (a language model continues it from nothing).
async function answer({settings, model, tokenizers}, line) {
  const text = line.normalize("NFC");
  const blank = !text.trim();
  if (settings.kind === "translation") {
    if (blank) return "";
    const outputs = await run(model, {pieces: piecesRow(tokenizers.source.pieces(text), settings.max_source_length)});
    return tokenizers.target.text(outputs.tokens);
  }
  if (settings.kind === "classification") {
    if (blank) return "";
    const outputs = await run(model, {pieces: piecesRow(tokenizers.text.pieces(text), settings.max_length)});
    const label = outputs.label_id[0];
    return `${settings.labels[label]}\t${outputs.probabilities[label].toFixed(4)}`;
  }
  const outputs = await run(model, {pieces: piecesRow(tokenizers.text.pieces(text), settings.max_length, true)});
  return tokenizers.text.text(outputs.tokens.slice(0, outputs.lengths[0]));
}

const page = {};

async function answerAll() {
  const button = element("run");
  button.disabled = true;
  const started = performance.now();
  try {
    const lines = element("input").value.split("\n");
    const answers = [];
    for (const line of lines) {
      answers.push(await answer(page, line));
      if (!document.body.dataset.firstMs) document.body.dataset.firstMs = Math.round(performance.now() - started);
    }
    element("translations").textContent = answers.join("\n");
    element("status").textContent = `${lines.length} line(s) in ${Math.round(performance.now() - started)} ms`;
  } catch (error) {  // the page serves on: the next request starts afresh
    element("status").textContent = `Could not answer: ${error.message}`;
  } finally {
    button.disabled = false;
    document.body.dataset.state = "done";
  }
}

try {
  const started = performance.now();
  Object.assign(page, await load());
  document.body.dataset.loadMs = Math.round(performance.now() - started);
  element("title").textContent = `${VERBS[page.settings.kind]}, offline`;
  element("status").textContent = `Ready: ${page.settings.kind.replace("_", " ")} on LiteRT.js, loaded in ` +
    `${document.body.dataset.loadMs} ms. Nothing you type leaves this page.`;
  element("input").disabled = element("run").disabled = false;
  element("run").textContent = VERBS[page.settings.kind];
  element("run").addEventListener("click", answerAll);
  const given = new URLSearchParams(location.search).get("text");
  if (given !== null) {
    element("input").value = given;
    await answerAll();
  } else {
    document.body.dataset.state = "ready";
  }
} catch (error) {
  element("status").textContent = `Could not load the model: ${error.message}`;
  document.body.dataset.state = "failed";
}
