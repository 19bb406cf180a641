// Each side's tokenizer as the page runs it, from the files the export wrote beside model.tflite
// (`keras_transformer.device_tokenizers` runs the same files in Python and says what each holds):
//
// - a WordPiece side: its tokenizer.json, through Hugging Face's tokenizers port;
// - a SentencePiece side: its .model, through SentencePiece's own C++ built for WebAssembly
//   (`@sctg/sentencepiece-js`), each piece numbered by the run's vocabulary (vocab.json; our ids are
//   the checkpoint's + 1, 0 being padding), with the run's rules (tokenizer.json: a `>>xx<<` code
//   split off, NLLB's word by word) and the text each id adds when decoded (surfaces.json).
//
// `read` fetches a file of the export: `read.json(path)`, `read.bytes(path)` (a Uint8Array). The page
// reads over HTTP; the suite runs this module in Node.js beside the Python runner, on the same files.
// Each library is imported when a side needs it: a page downloads only its own.

// What Python's `str.strip` takes off a SentencePiece side's decoded text (`device_tokenizers._WHITESPACE`).
const ENDS = /^[ \t\n\r\v\f]+|[ \t\n\r\v\f]+$/g;
const LANGUAGE_CODE = /^>>[\s\S]*?<</;

// One side's tokenizer, `recorded` being its entry in litert.json (`kind`, `directory`, `dropped_ids`).
// `encodes`, `decodes`: whether the page turns text into this side's ids, and ids into text. A SentencePiece
// side fetches only what it uses: a translation's source side no surfaces.json, its target side no model
// (which is neither downloaded nor started) and no vocab.json, each megabytes for a large vocabulary.
export async function loadTokenizer(recorded, read, {encodes = true, decodes = true} = {}) {
  if (recorded.kind === "wordpiece") {
    const {Tokenizer} = await import("@huggingface/tokenizers");
    const spec = await read.json(`${recorded.directory}/tokenizer.json`);
    return new WordPieceSide(new Tokenizer(spec, {}), recorded.dropped_ids);
  }
  if (recorded.kind === "sentencepiece") return SentencePieceSide.load(recorded, read, encodes, decodes);
  throw new Error(`this page cannot read a ${recorded.kind} tokenizer`);
}

class WordPieceSide {
  constructor(tokenizer, droppedIds) {
    this.tokenizer = tokenizer;
    this.dropped = new Set(droppedIds);
  }

  // A text's pieces' ids, unframed: what the file's `pieces` input holds.
  pieces(text) {
    return text ? this.tokenizer.encode(text, {add_special_tokens: false}).ids : [];
  }

  // The text of a row of ids (what the file answers), the framing left out.
  text(ids) {
    const kept = ids.filter((id) => !this.dropped.has(id));
    return kept.length ? this.tokenizer.decode(kept, {skip_special_tokens: false}) : "";
  }
}

class SentencePieceSide {
  static async load(recorded, read, encodes, decodes) {
    const directory = recorded.directory;
    const [settings, vocab, surfaces, processor] = await Promise.all([
      read.json(`${directory}/tokenizer.json`),
      encodes ? read.json(`${directory}/vocab.json`) : [],
      decodes ? read.json(`${directory}/surfaces.json`) : null,
      encodes ? read.bytes(`${directory}/sentencepiece.model`).then(sentencePiece) : null]);
    return new SentencePieceSide(processor, settings, vocab, surfaces, recorded.dropped_ids);
  }

  constructor(processor, settings, vocab, surfaces, droppedIds) {
    this.processor = processor;
    this.settings = settings;
    this.ids = new Map(vocab.map((piece, index) => [piece, index + 1]));  // our ids: 0 is padding
    this.unknownId = this.ids.get(settings.unk_token);
    this.surfaces = surfaces;
    this.dropped = new Set(droppedIds);
  }

  // A text's ids (a language code's, then its pieces'), unframed.
  pieces(text) {
    if (!this.processor) throw new Error("this side was loaded to decode only");
    const codeIds = [];
    const code = this.settings.language_code_prefix ? text.match(LANGUAGE_CODE) : null;
    if (code) {
      codeIds.push(this.id(code[0]));
      text = text.slice(code[0].length);
    }
    const pieces = this.settings.word_by_word ? this.wordByWord(text) : this.processor.encodePieces(text);
    return codeIds.concat(pieces.map((piece) => this.id(piece)));
  }

  id(piece) {
    return this.ids.get(piece) ?? this.unknownId;
  }

  // Each space-separated word's pieces, "▁" for an empty word (NLLB's tokenizer splits at spaces first).
  wordByWord(text) {
    if (this.settings.collapse_spaces) text = text.replace(/ {2,}/g, " ");
    const words = text.split(" ");
    if (words[0] === "") words.shift();  // the text's leading space is the first word's own "▁"
    return words.flatMap((word) => {
      const pieces = this.processor.encodePieces(word);
      return pieces.length ? pieces : ["\u2581"];
    });
  }

  // The text of a row of ids: each kept id's surface, the ends trimmed as the checkpoint's tokenizer trims them.
  text(ids) {
    if (!this.surfaces) throw new Error("this side was loaded to encode only");
    const text = ids.filter((id) => id >= 0 && id < this.surfaces.length && !this.dropped.has(id))
      .map((id) => this.surfaces[id]).join("");
    if (this.settings.strip_trailing_space ?? true) return text.replace(ENDS, "");
    return text.startsWith(" ") ? text.slice(1) : text;
  }
}

// SentencePiece's processor of a .model file's `bytes`, on its own WebAssembly instance.
async function sentencePiece(bytes) {
  const {SentencePieceProcessor} = await import("@sctg/sentencepiece-js");
  const processor = new SentencePieceProcessor();
  await processor.loadFromB64StringModel(base64(bytes));
  return processor;
}

// `bytes` in base64, as SentencePiece's loader takes a model (in slices: a large model is megabytes).
function base64(bytes) {
  let binary = "";
  for (let start = 0; start < bytes.length; start += 0x8000) {
    binary += String.fromCharCode(...bytes.subarray(start, start + 0x8000));
  }
  return btoa(binary);
}
