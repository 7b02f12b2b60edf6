// Helpers every view uses: elements built from text only (never HTML), formats, the data, the chunks.

const DATA = JSON.parse(document.getElementById("report-data").textContent);
const SVG_NS = "http://www.w3.org/2000/svg";
const FORBIDDEN = new Set(["href", "src", "srcdoc", "action", "formaction", "xlink:href", "style"]);
let IX = null; // the index: {strings, columns, prompts, side_by_side}, read at start

function setProps(node, props) {
  if (!props) return;
  for (const [key, value] of Object.entries(props)) {
    if (value === undefined || value === null || value === false) continue;
    if (key === "text") node.textContent = String(value);
    else if (key === "class") node.setAttribute("class", value);
    else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else if (key === "data") for (const [k, v] of Object.entries(value)) node.dataset[k] = String(v);
    else if (FORBIDDEN.has(key) || key.startsWith("on")) throw new Error("not an attribute the report sets: " + key);
    else node.setAttribute(key, value === true ? "" : String(value));
  }
}

function append(node, children) {
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

// An HTML element; every string child becomes a text node, so text from a run can never become markup.
function el(tag, props, ...children) {
  const node = document.createElement(tag);
  setProps(node, props);
  return append(node, children);
}

function svg(tag, props, ...children) {
  const node = document.createElementNS(SVG_NS, tag);
  setProps(node, props);
  return append(node, children);
}

function str(code) {
  return code === null || code === undefined || code < 0 ? null : IX.strings[code];
}

// The formats take any value a line may hold: a number is formatted, anything else (a hand-edited "0.50", an
// object) is shown as the text it is, so no line's odd field keeps its view from being drawn.
const NUMBER = new Intl.NumberFormat("en-US");
function asText(x) {
  return typeof x === "string" ? x : JSON.stringify(x);
}
function isNumber(x) {
  return typeof x === "number" && Number.isFinite(x);
}
function fmtInt(n) {
  return n === null || n === undefined ? "–" : isNumber(n) ? NUMBER.format(n) : asText(n);
}
function fmtPct(x, digits = 1) {
  return x === null || x === undefined ? "–" : isNumber(x) ? (x * 100).toFixed(digits) + "%" : asText(x);
}
function fmtNum(x, digits = 3) {
  return x === null || x === undefined ? "–" : isNumber(x) ? x.toFixed(digits) : asText(x);
}
function fmtCost(x) {
  if (x === null || x === undefined) return "–";
  if (!isNumber(x)) return asText(x);
  return "$" + (x >= 100 ? x.toFixed(0) : x >= 1 ? x.toFixed(2) : x.toFixed(4));
}
function fmtSecs(s) {
  if (s === null || s === undefined) return "–";
  if (!isNumber(s)) return asText(s);
  if (s < 60) return s.toFixed(1) + " s";
  if (s < 3600) return Math.floor(s / 60) + " min " + Math.round(s % 60) + " s";
  return Math.floor(s / 3600) + " h " + Math.round((s % 3600) / 60) + " min";
}
function fmtValue(field, x) {
  return field === "cost" ? fmtCost(x) : field === "seconds" ? fmtSecs(x) : fmtInt(x);
}
function plural(n, one, many) {
  return fmtInt(n) + " " + (n === 1 ? one : many || one + "s");
}
function cut(text, n) {
  text = String(text);
  return text.length > n ? text.slice(0, n - 1) + "…" : text;
}

function base64Bytes(text) {
  if (Uint8Array.fromBase64) return Uint8Array.fromBase64(text);
  const bin = atob(text);
  const out = new Uint8Array(bin.length);
  for (let i = 0; i < bin.length; i++) out[i] = bin.charCodeAt(i);
  return out;
}

async function gunzipJSON(text) {
  const stream = new Blob([base64Bytes(text)]).stream().pipeThrough(new DecompressionStream("gzip"));
  return JSON.parse(await new Response(stream).text());
}

// The chunks follow the page's script in the file: one not parsed yet is there once the document is.
const documentParsed = new Promise((resolve) => {
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", resolve);
  else resolve();
});
const chunkCache = new Map();
const CHUNKS_KEPT = 48;

async function chunk(n) {
  if (chunkCache.has(n)) {
    const hit = chunkCache.get(n);
    chunkCache.delete(n);
    chunkCache.set(n, hit);
    return hit;
  }
  let node = document.getElementById("c" + n);
  if (!node) {
    await documentParsed;
    node = document.getElementById("c" + n);
  }
  if (!node) throw new Error("part " + n + " of the trajectories is missing: the report file is incomplete");
  const items = gunzipJSON(node.textContent);
  chunkCache.set(n, items);
  if (chunkCache.size > CHUNKS_KEPT) chunkCache.delete(chunkCache.keys().next().value);
  return items;
}

function chunkOf(id) {
  const starts = DATA.chunk_starts;
  let lo = 0;
  let hi = starts.length - 1;
  while (lo < hi) {
    const mid = (lo + hi + 1) >> 1;
    if (starts[mid] <= id) lo = mid;
    else hi = mid - 1;
  }
  return lo;
}

async function payload(id) {
  const n = chunkOf(id);
  const items = await chunk(n);
  return items[id - DATA.chunk_starts[n]];
}

// One row of the index as an object (the list, the trajectory view and the top lists read these).
function item(id) {
  const c = IX.columns;
  return {
    id,
    run: c.run[id],
    kind: DATA.kinds[c.kind[id]],
    prompt: c.prompt[id],
    pindex: c.pindex[id],
    sample: c.sample[id],
    status: DATA.statuses[c.status[id]],
    reward: c.reward[id],
    stop: str(c.stop[id]),
    toolsets: str(c.toolsets[id]),
    failedTools: str(c.failed_tools[id]),
    tokens: c.tokens[id],
    cost: c.cost[id],
    seconds: c.seconds[id],
    calls: c.calls[id],
    category: str(c.category[id]),
    reason: c.reason[id],
    file: str(c.file[id]),
    line: c.line[id],
  };
}

function promptText(p) {
  return IX.prompts.text[p];
}

// The outcome of an item as one word and a badge class.
function outcomeOf(it) {
  if (it.kind === "failed") return ["failed attempt", "bad"];
  if (it.status === "passed") return ["passed", "good"];
  if (it.status === "failed") return ["not passed", "bad"]; // a check that did not pass; "failed" is an attempt's word
  if (it.status === "timeout" || it.status === "error") return ["check " + it.status, "warn"];
  return ["no check", "muted"];
}

// "#12" for prompt 12 (of a run of one sample a prompt), "#12 s2" for its sample 2.
function itemLabel(it) {
  const samples = DATA.runs[it.run].statistics.outcomes.samples_per_prompt;
  return "#" + (it.pindex ?? "?") + (samples > 1 ? " s" + it.sample : "");
}

function badge(text, cls) {
  return el("span", { class: "badge " + (cls || "muted"), text });
}

// A scrolled list drawing only the rows in view, so a list of 100,000 rows stays smooth.
function virtualList(rowHeight, render) {
  const outer = el("div", { class: "vlist", tabindex: "0" });
  const inner = el("div", { class: "vlist-inner" });
  outer.append(inner);
  let count = 0;
  let pending = false;
  function draw() {
    pending = false;
    const top = outer.scrollTop;
    const height = outer.clientHeight || 600;
    const first = Math.max(0, Math.floor(top / rowHeight) - 10);
    const last = Math.min(count, Math.ceil((top + height) / rowHeight) + 10);
    const rows = [];
    for (let i = first; i < last; i++) {
      const row = render(i);
      row.style.transform = "translateY(" + i * rowHeight + "px)";
      row.style.height = rowHeight + "px";
      rows.push(row);
    }
    inner.replaceChildren(...rows);
  }
  function schedule() {
    if (!pending) {
      pending = true;
      requestAnimationFrame(draw);
    }
  }
  outer.addEventListener("scroll", schedule);
  return {
    node: outer,
    setCount(n) {
      count = n;
      inner.style.height = n * rowHeight + "px";
      draw();
    },
    redraw: draw,
    scrollTo(i) {
      const top = i * rowHeight;
      if (top < outer.scrollTop || top > outer.scrollTop + outer.clientHeight - rowHeight) outer.scrollTop = top;
      schedule();
    },
  };
}

function section(title, ...children) {
  return el("section", { class: "panel" }, el("h2", { text: title }), ...children);
}

function note(text) {
  return el("p", { class: "note", text });
}

function table(head, rows, cls) {
  return el(
    "table",
    { class: "grid " + (cls || "") },
    el("thead", null, el("tr", null, head.map((h) => el("th", { text: h })))),
    el(
      "tbody",
      null,
      rows.map((cells) => el("tr", null, cells.map((c) => (c instanceof Node && c.tagName === "TD" ? c : el("td", null, c))))),
    ),
  );
}
