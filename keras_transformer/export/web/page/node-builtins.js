// What SentencePiece's npm build (`@sctg/sentencepiece-js`) imports from Node.js, for a browser: the
// page's import map names this module for both "fs" and "buffer". Its file reading (`fs`) is for
// Node.js only and never called here; of `Buffer` it needs one thing, a model's bytes from base64.
// (The library also sets `globalThis.Buffer` to this object when it loads.)

export const Buffer = {
  from(text, encoding) {
    if (encoding !== "base64") throw new Error(`this page decodes base64 only, not ${encoding}`);
    return Uint8Array.from(atob(text), (character) => character.charCodeAt(0));
  },
};
