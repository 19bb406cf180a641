// transformers.js as its users run a translation model in a browser: a `translation` pipeline on the
// WebAssembly backend, greedy, one sentence at a time (as our page translates), every file local.
// `?dtype=` picks the ONNX files (q8, transformers.js's default on WebAssembly, or fp32);
// `?threads=` ONNX Runtime's threads (more than one needs a cross-origin isolated page).

import {env, pipeline} from "./vendor/transformers.min.js";

const element = (id) => document.getElementById(id);
const asked = new URLSearchParams(location.search);

env.allowLocalModels = true;
env.allowRemoteModels = false;  // a missing file is an error, never a download
env.localModelPath = new URL("models/", location.href).pathname;  // a path: a full URL counts as remote
env.useBrowserCache = false;    // each round loads afresh, as a first visit does
env.backends.onnx.wasm.wasmPaths = new URL("vendor/", location.href).href;
env.backends.onnx.wasm.numThreads = Number(asked.get("threads") || 1);

try {
  const started = performance.now();
  const translator = await pipeline("translation", "marian", {dtype: asked.get("dtype") || "q8", device: "wasm"});
  document.body.dataset.loadMs = Math.round(performance.now() - started);
  document.body.dataset.isolated = String(self.crossOriginIsolated);
  const lines = (asked.get("text") || "").split("\n");
  const begun = performance.now();
  const answers = [];
  for (const line of lines) {
    const [answer] = await translator(line, {num_beams: 1, do_sample: false,
                                             max_new_tokens: Number(asked.get("max_new_tokens") || 256)});
    answers.push(answer.translation_text);
    if (!document.body.dataset.firstMs) document.body.dataset.firstMs = Math.round(performance.now() - begun);
  }
  element("translations").textContent = answers.join("\n");
  element("status").textContent = `${lines.length} line(s) in ${Math.round(performance.now() - begun)} ms`;
  document.body.dataset.state = "done";
} catch (error) {
  element("status").textContent = `Could not translate: ${error.message}`;
  document.body.dataset.state = "failed";
}
