// The trajectory browser: every line of the run(s) in one list, filtered and searched, beside the open one.

const ROW = 30;
const FILTERS = { q: "", deep: false, outcome: "", kind: "", stop: "", toolset: "", tool: "", category: "", run: "", prompt: "", sort: "" };
const filters = { ...FILTERS };
let shown = new Int32Array(0); // the ids the list shows, in order
let selected = -1;
let lower = null; // lowercased search texts, made on the first search
const deep = { query: "", hits: null, running: null, done: 0 };

function showList(given) {
  Object.assign(filters, FILTERS, given);
  location.hash = "#trajectories";
  refreshList();
}

// The string codes whose comma- (or " · "-) separated names include `name`.
function codesWith(column, name, sep) {
  const out = new Set();
  for (const code of new Set(IX.columns[column])) {
    const value = str(code);
    if (value !== null && value.split(sep).includes(name)) out.add(code);
  }
  return out;
}

function namesIn(column, sep) {
  const names = new Set();
  for (const code of new Set(IX.columns[column])) {
    const value = str(code);
    if (value) for (const n of value.split(sep)) if (n) names.add(n);
  }
  return [...names].sort();
}

function searchTexts() {
  if (!lower) {
    const c = IX.columns;
    lower = {
      prompts: IX.prompts.text.map((t) => t.toLowerCase()),
      reasons: c.reason.map((t) => (t ? t.toLowerCase() : "")),
    };
  }
  return lower;
}

function matching() {
  const c = IX.columns;
  const n = c.run.length;
  const q = filters.q.trim().toLowerCase();
  const texts = q ? searchTexts() : null;
  const stop = filters.stop ? IX.strings.indexOf(filters.stop) : null;
  const toolsets = filters.toolset ? codesWith("toolsets", filters.toolset, ",") : null;
  const tools = filters.tool ? codesWith("failed_tools", filters.tool, ",") : null;
  const cats = filters.category ? codesWith("category", filters.category, " · ") : null;
  const kind = filters.kind ? DATA.kinds.indexOf(filters.kind) : null;
  const run = filters.run === "" ? null : Number(filters.run);
  const prompt = filters.prompt === "" ? null : Number(filters.prompt);
  const useDeep = q && filters.deep && deep.query === q && deep.hits;
  const out = [];
  for (let i = 0; i < n; i++) {
    if (run !== null && c.run[i] !== run) continue;
    if (kind !== null && c.kind[i] !== kind) continue;
    if (prompt !== null && c.prompt[i] !== prompt) continue;
    if (filters.outcome) {
      const s = c.status[i];
      const ok =
        filters.outcome === "passed" ? s === 0 : filters.outcome === "not_passed" ? s === 1 : filters.outcome === "noresult" ? s === 2 || s === 3 : s === 4 && c.kind[i] !== 2;
      if (!ok) continue;
    }
    if (stop !== null && c.stop[i] !== stop) continue;
    if (toolsets && !toolsets.has(c.toolsets[i])) continue;
    if (tools && !tools.has(c.failed_tools[i])) continue;
    if (cats && !cats.has(c.category[i])) continue;
    if (q) {
      const found = texts.prompts[c.prompt[i]].includes(q) || texts.reasons[i].includes(q);
      if (!found && !(useDeep && deep.hits[i])) continue;
    }
    out.push(i);
  }
  const key = { tokens: c.tokens, cost: c.cost, seconds: c.seconds, reward: c.reward, calls: c.calls }[filters.sort];
  if (key) out.sort((a, b) => (key[b] ?? -1) - (key[a] ?? -1) || a - b);
  return Int32Array.from(out);
}

// Every string of a payload, for the search inside turns.
function payloadText(value) {
  const parts = [];
  const stack = [value];
  while (stack.length) {
    const v = stack.pop();
    if (typeof v === "string") parts.push(v);
    else if (v && typeof v === "object") for (const x of Object.values(v)) stack.push(x);
  }
  return parts.join("\n").toLowerCase();
}

async function runDeepSearch(q, onProgress) {
  const token = {};
  deep.running = token;
  deep.query = q;
  deep.hits = new Uint8Array(IX.columns.run.length);
  const chunks = DATA.chunk_starts.length;
  for (let n = 0; n < chunks; n++) {
    if (deep.running !== token) return false;
    const items = await chunk(n);
    const start = DATA.chunk_starts[n];
    items.forEach((p, j) => {
      if (payloadText(p).includes(q)) deep.hits[start + j] = 1;
    });
    deep.done = (n + 1) / chunks;
    if (n % 20 === 19) onProgress();
  }
  deep.running = null;
  return true;
}

let list = null;
let countLabel = null;
let detailPane = null;

function listRow(i) {
  const it = item(shown[i]);
  const [word, cls] = outcomeOf(it);
  const multi = DATA.runs.length > 1;
  return el(
    "div",
    { class: "row" + (it.id === selected ? " selected" : ""), data: { id: it.id }, onclick: () => openItem(it.id) },
    multi ? el("span", { class: "run-name", text: cut(DATA.runs[it.run].name, 14) }) : null,
    el("span", { class: "pid", text: itemLabel(it) }),
    badge(word, cls + " outcome"),
    el("span", { class: "stop", text: it.stop || "" }),
    el("span", { class: "num", text: fmtInt(it.tokens) }),
    it.kind === "discarded" ? badge("discarded", "warn") : null,
    el("span", { class: "text", text: cut(promptText(it.prompt), 200) }),
  );
}

function select(name, label, options, help) {
  const node = el(
    "select",
    { name, title: help || label, onchange: (e) => ((filters[name] = e.target.value), refreshList()) },
    el("option", { value: "", text: label }),
    options.map(([value, text]) => el("option", { value, text })),
  );
  node.value = filters[name];
  return node;
}

function filterBar() {
  const runs = DATA.runs.map((r, i) => [String(i), "run " + r.name]);
  const stops = [...new Set(IX.columns.stop)].map(str).filter(Boolean).sort();
  const search = el("input", { type: "search", name: "q", placeholder: "search prompts and errors", value: filters.q });
  let timer = 0;
  search.addEventListener("input", () => {
    clearTimeout(timer);
    timer = setTimeout(() => ((filters.q = search.value), refreshList()), 150);
  });
  const inTurns = el("input", { type: "checkbox", name: "deep" });
  inTurns.checked = filters.deep;
  inTurns.addEventListener("change", () => ((filters.deep = inTurns.checked), refreshList()));
  const cats = namesIn("category", " · ");
  const chips = [];
  if (filters.prompt !== "") {
    chips.push(el("button", { class: "chip", title: "show every prompt", text: "prompt: " + cut(promptText(Number(filters.prompt)), 40) + " ✕", onclick: () => ((filters.prompt = ""), renderBrowser()) }));
  }
  return el(
    "div",
    { class: "filters" },
    el("div", { class: "filter-line" }, search, el("label", { class: "check", title: "also search every turn (answers, tool calls, results, checks): decodes every trajectory, slower on large runs" }, inTurns, " in turns")),
    el(
      "div",
      { class: "filter-line" },
      DATA.runs.length > 1 ? select("run", "all runs", runs) : null,
      select("outcome", "any outcome", [["passed", "passed"], ["not_passed", "not passed"], ["noresult", "check gave no result"], ["nocheck", "no check"]]),
      select("kind", "any kind", [["trajectory", "trajectories"], ["discarded", "discarded"], ["failed", "failed attempts"]]),
      select("stop", "any stop reason", stops.map((s) => [s, s])),
      select("toolset", "any toolset", namesIn("toolsets", ",").map((t) => [t, t])),
      select("tool", "any failed tool", namesIn("failed_tools", ",").map((t) => [t, t + " failed"]), "trajectories in which this tool failed"),
      cats.length ? select("category", "any category", cats.map((t) => [t, t])) : null,
      select("sort", "file order", [["tokens", "most tokens"], ["cost", "most cost"], ["seconds", "slowest"], ["reward", "highest reward"], ["calls", "most model calls"]], "order"),
      chips,
    ),
  );
}

function refreshList() {
  if (!list) return;
  const q = filters.q.trim().toLowerCase();
  if (q && filters.deep && deep.query !== q) {
    runDeepSearch(q, () => updateCount()).then((finished) => finished && refreshList());
  }
  shown = matching();
  list.setCount(shown.length);
  updateCount();
}

function updateCount() {
  if (!countLabel) return;
  const q = filters.q.trim().toLowerCase();
  const searching = q && filters.deep && deep.running && deep.query === q;
  countLabel.textContent = `${fmtInt(shown.length)} of ${fmtInt(IX.columns.run.length)} shown` + (searching ? ` · searching the turns: ${Math.round(deep.done * 100)}%` : "");
  countLabel.dataset.shown = shown.length;
}

function renderBrowser(openId) {
  list = virtualList(ROW, listRow);
  countLabel = el("p", { class: "count", "aria-live": "polite" });
  detailPane = el("div", { class: "detail" }, note("Choose a trajectory in the list to see its turns."));
  const head = el(
    "div",
    { class: "row list-head" },
    DATA.runs.length > 1 ? el("span", { class: "run-name", text: "run" }) : null,
    el("span", { class: "pid", text: "prompt" }),
    el("span", { class: "badge outcome", text: "outcome" }),
    el("span", { class: "stop", text: "stop" }),
    el("span", { class: "num", text: "tokens" }),
    el("span", { class: "text" }),
  );
  const view = el("div", { class: "browser" }, el("div", { class: "list-side" }, filterBar(), countLabel, head, list.node), detailPane);
  mount([view]);
  refreshList();
  if (openId !== undefined && openId >= 0 && openId < IX.columns.run.length) showItem(openId);
}

function openItem(id) {
  location.hash = "#trajectories/" + id;
}

function showItem(id) {
  selected = id;
  if (list) list.redraw();
  const at = shown.indexOf(id);
  if (at >= 0 && list) list.scrollTo(at);
  renderTrajectory(id, detailPane);
}
