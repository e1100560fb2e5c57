// "Try the translator": the book's translator run in the reader's browser. The model is the
// shipped averaged checkpoint exported by code/export_onnx.py to two ONNX graphs, run by
// ONNX Runtime Web (WebAssembly); the BPE tokenizer is the one the model was trained with,
// read by @huggingface/tokenizers. Decoding follows the book's `greedy_decode` and
// `beam_search` (chapter 6.1) step for step, for one sentence: the same candidates, the
// same order, the same stopping rule, with scores kept in float32 as there.

const here = new URL(".", import.meta.url); // .../_static/
const files = new URL("translator/", here);
const vendor = new URL("translator/vendor/", here);
const page = {
  source: document.getElementById("source"),
  button: document.getElementById("translate-button"),
  decoding: document.getElementById("decoding"),
  head: document.getElementById("head"),
  status: document.getElementById("status"),
  translation: document.getElementById("translation"),
  timing: document.getElementById("timing"),
  attention: document.getElementById("attention"),
  examples: document.getElementById("examples"),
};

function say(text, isError = false) {
  page.status.textContent = text;
  page.status.classList.toggle("translator-error", isError);
}

// ---- loading: everything comes from this site; nothing from elsewhere

async function load() {
  if (location.protocol === "file:") {
    throw new Error(
      "Your browser does not load the model's files from a page opened as a file. Serve " +
        "the book instead: python -m http.server --directory _build/html, then open " +
        "http://127.0.0.1:8000/chapters/try_translator.html",
    );
  }
  let ort, Tokenizer;
  try {
    ort = await import(new URL("ort.wasm.min.mjs", vendor).href);
    ({ Tokenizer } = await import(new URL("tokenizers.min.mjs", vendor).href));
  } catch (error) {
    throw new Error(
      "This page's engine is not installed in this build. From the book's folder run " +
        "npm ci and python code/export_onnx.py, then build the book again. (" + error.message + ")",
    );
  }
  ort.env.wasm.wasmPaths = vendor.href;
  ort.env.wasm.numThreads = 1; // threads need cross-origin isolation, which a plain server lacks
  const fetchJson = async (name) => {
    const response = await fetch(new URL(name, files));
    if (!response.ok) throw new Error(`${name}: ${response.status} ${response.statusText}`);
    return response.json();
  };
  const [settings, tokenizerJson] = await Promise.all([
    fetchJson("translator.json"),
    fetchJson("tokenizer.json"),
  ]);
  const session = (name) => ort.InferenceSession.create(new URL(name, files).href);
  const [encoder, decoder] = await Promise.all([session("encoder.onnx"), session("decoder.onnx")]);
  return { ort, settings, tokenizer: new Tokenizer(tokenizerJson, {}), encoder, decoder };
}

// ---- the model: encode once, then one decoder run per step over the whole prefix

function idsTensor(ort, rows) {
  const width = rows[0].length;
  const data = BigInt64Array.from(rows.flat(), (id) => BigInt(id));
  return new ort.Tensor("int64", data, [rows.length, width]);
}

async function encode(model, sourceIds) {
  const src = idsTensor(model.ort, [sourceIds]);
  const { memory } = await model.encoder.run({ src });
  return { src, memory };
}

// log-probabilities of the next token for each prefix in `prefixes` (all of one length),
// and the last layer's encoder-decoder attention (rows, h, length, src_len)
async function nextLogProbs(model, encoded, prefixes) {
  const rows = prefixes.length;
  const [, srcLen, dModel] = encoded.memory.dims;
  const memory = new model.ort.Tensor(
    "float32",
    repeatRows(encoded.memory.data, rows),
    [rows, srcLen, dModel],
  );
  const src = idsTensor(model.ort, Array(rows).fill(Array.from(encoded.src.data, Number)));
  const out = await model.decoder.run({ memory, src, tgt: idsTensor(model.ort, prefixes) });
  return { logProbs: out.log_probs, attention: out.attention };
}

function repeatRows(data, rows) {
  const out = new Float32Array(data.length * rows);
  for (let r = 0; r < rows; r++) out.set(data, r * data.length);
  return out;
}

// ---- decoding, as in chapter 6.1

const lengthPenalty = (length, alpha) => ((5 + length) / 6) ** alpha; // Wu et al. (2016)

async function greedy(model, encoded, limit) {
  const { bos_id: bos, eos_id: eos } = model.settings;
  const ys = [bos];
  for (let t = 0; t < limit; t++) {
    const { logProbs } = await nextLogProbs(model, encoded, [ys]);
    let best = 0;
    for (let v = 1; v < logProbs.data.length; v++) if (logProbs.data[v] > logProbs.data[best]) best = v;
    ys.push(best);
    if (best === eos) break;
  }
  return ys;
}

// the 2k best one-token extensions of the hypotheses: [score, parent row, token], best first
function bestExtensions(scores, logProbs, k) {
  const vocab = logProbs.dims[1];
  const candidates = [];
  for (let row = 0; row < scores.length; row++) {
    if (scores[row] === -Infinity) continue; // an empty slot only offers -inf
    for (let v = 0; v < vocab; v++) {
      candidates.push([Math.fround(scores[row] + logProbs.data[row * vocab + v]), row, v]);
    }
  }
  candidates.sort((a, b) => b[0] - a[0] || a[1] * vocab + a[2] - (b[1] * vocab + b[2]));
  return candidates.slice(0, 2 * k);
}

async function beamSearch(model, encoded, limit) {
  const { bos_id: bos, eos_id: eos, alpha } = model.settings;
  const k = model.settings.beam_size;
  const limitPenalty = lengthPenalty(limit, alpha); // the largest lp this sentence can reach
  let ys = [[bos]];
  let scores = [0];
  let finished = { score: -Infinity, tokens: [bos] };
  for (let length = 1; length <= limit; length++) {
    const live = ys.map((_, row) => row).filter((row) => scores[row] !== -Infinity);
    const { logProbs } = await nextLogProbs(model, encoded, live.map((row) => ys[row]));
    const liveScores = live.map((row) => scores[row]);
    const top = bestExtensions(liveScores, logProbs, k).map(([s, r, v]) => [s, live[r], v]);
    // walk down the candidates, best first, until k go on; those that end on the way finish
    const next = [];
    for (const [score, parent, token] of top) {
      if (next.length >= k) break;
      const ends = token === eos || length >= limit;
      if (!ends) {
        next.push({ score, tokens: [...ys[parent], token] });
        continue;
      }
      const ranked = score / lengthPenalty(length, alpha);
      if (ranked > finished.score) finished = { score: ranked, tokens: [...ys[parent], token] };
    }
    if (next.length === 0) break;
    ys = next.map((h) => h.tokens);
    scores = next.map((h) => h.score);
    // log P only falls as a hypothesis grows, and lp is largest at the length limit
    if (finished.score >= Math.max(...scores) / limitPenalty) break;
  }
  return finished.tokens;
}

async function translate(model, sentence, beam) {
  const { eos_id: eos, extra_length: extra, max_source_tokens: longest } = model.settings;
  const encodedText = model.tokenizer.encode(sentence.normalize("NFC"));
  const sourceIds = [...encodedText.ids, eos];
  if (sourceIds.length > longest) {
    throw new Error(`This sentence has ${sourceIds.length} tokens; the page translates at most ${longest}.`);
  }
  const encoded = await encode(model, sourceIds);
  const limit = sourceIds.length + extra; // §6.1: at most input length + 50
  const output = beam ? await beamSearch(model, encoded, limit) : await greedy(model, encoded, limit);
  // one decoder run over the whole output gives every step's attention at once
  const { attention } = await nextLogProbs(model, encoded, [output]);
  const text = model.tokenizer.decode(output, { skip_special_tokens: true });
  const sourceTokens = [...encodedText.tokens, "</s>"];
  const targetTokens = output.slice(1).map((id) => model.tokenizer.id_to_token(id));
  return { text, attention, sourceTokens, targetTokens };
}

// ---- the picture: generated tokens (rows) against source tokens (columns)

function headWeights(result, head) {
  const [, heads, steps, srcLen] = result.attention.dims;
  const data = result.attention.data;
  const rows = [];
  for (let t = 0; t < result.targetTokens.length && t < steps; t++) {
    const row = new Array(srcLen).fill(0);
    for (let h = 0; h < heads; h++) {
      if (head !== "mean" && Number(head) !== h) continue;
      for (let s = 0; s < srcLen; s++) row[s] += data[(h * steps + t) * srcLen + s];
    }
    rows.push(head === "mean" ? row.map((w) => w / heads) : row);
  }
  return rows;
}

function draw(result, head) {
  const weights = headWeights(result, head);
  const svgNS = "http://www.w3.org/2000/svg";
  const cell = 22;
  const left = 8 + 7 * Math.max(...result.targetTokens.map((t) => t.length));
  const topMargin = 8 + 7 * Math.max(...result.sourceTokens.map((t) => t.length));
  const width = left + cell * result.sourceTokens.length;
  const height = topMargin + cell * weights.length;
  const svg = document.createElementNS(svgNS, "svg");
  svg.setAttribute("viewBox", `0 0 ${width} ${height}`);
  svg.setAttribute("width", "100%");
  svg.setAttribute("role", "img");
  svg.setAttribute(
    "aria-label",
    `Encoder-decoder attention of the last decoder layer (${head === "mean" ? "mean of the heads" : `head ${Number(head) + 1}`}): ` +
      "one row per generated token, one column per source token; darker is more weight.",
  );
  svg.style.maxWidth = `${width * 1.4}px`;
  const text = (x, y, content, rotate) => {
    const label = document.createElementNS(svgNS, "text");
    label.setAttribute("x", x);
    label.setAttribute("y", y);
    label.setAttribute("font-size", "12");
    // row labels end at the grid; column labels, turned upright, start just above it
    label.setAttribute("text-anchor", rotate ? "start" : "end");
    if (rotate) label.setAttribute("transform", `rotate(-90 ${x} ${y})`);
    label.textContent = content;
    svg.appendChild(label);
  };
  result.sourceTokens.forEach((token, s) => text(left + cell * s + cell / 2 + 4, topMargin - 4, token, true));
  weights.forEach((row, t) => {
    text(left - 4, topMargin + cell * t + cell / 2 + 4, result.targetTokens[t]);
    row.forEach((w, s) => {
      const square = document.createElementNS(svgNS, "rect");
      square.setAttribute("x", left + cell * s);
      square.setAttribute("y", topMargin + cell * t);
      square.setAttribute("width", cell - 1);
      square.setAttribute("height", cell - 1);
      const shade = Math.round(255 * (1 - Math.min(1, w)));
      square.setAttribute("fill", `rgb(${shade}, ${shade}, 255)`);
      const tip = document.createElementNS(svgNS, "title");
      tip.textContent = `${result.targetTokens[t]} → ${result.sourceTokens[s]}: ${w.toFixed(2)}`;
      square.appendChild(tip);
      svg.appendChild(square);
    });
  });
  const key = document.createElement("p");
  key.className = "translator-timing";
  key.textContent = "White is weight 0, full blue is 1; point at a cell to read its weight.";
  page.attention.replaceChildren(svg, key);
}

// ---- the page

let model = null;
let last = null;

async function run(sentence) {
  if (!sentence.trim()) return;
  page.button.disabled = true;
  say("Translating…");
  try {
    const start = performance.now();
    last = await translate(model, sentence, page.decoding.value === "beam");
    const seconds = (performance.now() - start) / 1000;
    page.translation.textContent = last.text;
    page.timing.textContent = `Translated in ${seconds.toFixed(2)} s (${page.decoding.value === "beam" ? `beam search, beam 4, α = ${model.settings.alpha}` : "greedy decoding"}).`;
    page.translation.dataset.seconds = seconds.toFixed(3);
    draw(last, page.head.value);
    say("");
  } catch (error) {
    say(error.message, true);
  } finally {
    page.button.disabled = false;
  }
}

async function main() {
  say("Loading the model (about 13 MB) and the engine…");
  try {
    model = await load();
  } catch (error) {
    say(error.message, true);
    return;
  }
  // the length penalty val chose for these weights (chapter 6.1), as the export recorded it
  page.decoding.options[0].textContent = `beam search (4, α = ${model.settings.alpha})`;
  for (let h = 0; h < model.settings.heads; h++) {
    page.head.add(new Option(`head ${h + 1}`, String(h)));
  }
  for (const sentence of model.settings.examples) {
    const item = document.createElement("button");
    item.type = "button";
    item.className = "translator-example";
    item.textContent = sentence;
    item.addEventListener("click", () => {
      page.source.value = sentence;
      run(sentence);
    });
    page.examples.appendChild(item);
  }
  page.button.addEventListener("click", () => run(page.source.value));
  page.head.addEventListener("change", () => last && draw(last, page.head.value));
  page.button.disabled = false;
  say("");
  const shared = new URLSearchParams(location.search).get("de");
  if (shared) {
    page.source.value = shared;
    await run(shared);
  }
}

main();
