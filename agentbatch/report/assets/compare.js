// Runs side by side: their figures in columns, and per prompt which runs passed it.

function datasetNote() {
  const c = DATA.compare;
  const names = DATA.runs.map((r) => r.name);
  if (c.same_dataset) return el("p", { class: "note dataset same" }, `All ${names.length} runs are of one dataset: ${plural(c.prompts_in_any, "prompt")} seen.`);
  const each = c.datasets.map((d, i) => `${d.run}: ${d.dataset_file || "dataset unknown"}, ${plural(c.prompts_per_run[i], "prompt")} seen`).join("; ");
  return el(
    "p",
    { class: "note dataset different" },
    `These runs are of different datasets (${each}). Prompts are matched by their text: ${plural(c.prompts_in_all, "prompt")} are in every run, ${fmtInt(c.prompts_in_any)} in any.`,
  );
}

function compareView() {
  const runs = DATA.runs;
  const stats = runs.map((r) => r.statistics);
  const ks = [...new Set(stats.flatMap((s) => Object.keys(s.outcomes.pass_at_k).map(Number)))].sort((a, b) => a - b);
  const rows = [
    ["samples", (s) => (s.samples.total === null ? "?" : fmtInt(s.samples.total))],
    ["done", (s) => fmtInt(s.samples.done)],
    ["discarded", (s) => fmtInt(s.discarded)],
    ["failed", (s) => fmtInt(s.samples.failed)],
    ["completed", (s) => fmtInt(s.completed)],
    ["checked", (s) => fmtInt(s.outcomes.checked)],
    ["passed", (s) => fmtInt(s.outcomes.passed)],
    ["pass rate", (s) => fmtPct(s.outcomes.pass_rate), (s) => s.outcomes.pass_rate],
    ["mean reward", (s) => fmtNum(s.outcomes.mean_reward), (s) => s.outcomes.mean_reward],
    ...ks.map((k) => ["pass@" + k, (s) => fmtNum(s.outcomes.pass_at_k[k]), (s) => s.outcomes.pass_at_k[k] ?? ""]),
    ["tokens", (s) => fmtInt(s.tokens.total.total_tokens)],
    ["tokens per pass", (s) => fmtInt(s.outcomes.tokens_per_pass === null ? null : Math.round(s.outcomes.tokens_per_pass))],
    ["cost", (s) => fmtCost(s.cost.total)],
    ["cost per completed", (s) => fmtCost(s.cost.per_completed)],
    ["cost per pass", (s) => fmtCost(s.cost.per_passing)],
    ["model calls", (s) => fmtInt(s.api_calls)],
    ["reasoning", (s) => fmtPct(s.reasoning.coverage)],
  ];
  const figures = table(
    ["", ...runs.map((r) => r.name)],
    rows.map(([name, show, raw]) => [name, ...stats.map((s) => el("td", { text: show(s), data: raw ? { figure: name, value: raw(s) ?? "" } : { figure: name } }))]),
    "side-by-side",
  );
  const reasons = [...new Set(stats.flatMap((s) => Object.keys(s.stop_reasons)))];
  const tools = [...new Set(stats.flatMap((s) => Object.keys(s.tools).filter((t) => s.tools[t].count)))].sort();
  return [
    section("Runs side by side", datasetNote(), el("p", { class: "meta" }, runs.map((r, i) => [i ? " · " : "", r.name + ": " + (r.checkpoint.model || "?")])), figures),
    section("pass@k", lineChart(runs.map((r) => passAtSeries(r.name, r.statistics.outcomes)), { xLabel: "k (samples)", xName: "k", label: "pass@k by run", class: "pass-at-k-runs" })),
    section("Stop reasons", table(["", ...runs.map((r) => r.name)], reasons.map((k) => [k, ...stats.map((s) => fmtInt(s.stop_reasons[k] || 0))]))),
    section(
      "Tools",
      table(
        ["tool", ...runs.map((r) => r.name + ": calls, failed")],
        tools.map((t) => [t, ...stats.map((s) => (s.tools[t] && s.tools[t].count ? `${fmtInt(s.tools[t].count)}, ${fmtPct(s.tools[t].failure / s.tools[t].count, 0)}` : "–"))]),
      ),
    ),
  ];
}

// A run passed a prompt when one of its samples did.
function passes(run, p) {
  return IX.side_by_side.passed[run][p] > 0;
}
function checked(run, p) {
  return IX.side_by_side.checked[run][p] > 0;
}

const promptFilter = { which: "all", a: 0, b: 1, everyRun: false };

function promptMatches(p) {
  const sbs = IX.side_by_side;
  const runs = DATA.runs.map((_, i) => i);
  if (promptFilter.everyRun && !runs.every((r) => sbs.samples[r][p] || sbs.failed_attempts[r][p])) return false;
  switch (promptFilter.which) {
    case "differ":
      return runs.some((r) => passes(r, p)) && runs.some((r) => checked(r, p) && !passes(r, p));
    case "none":
      return runs.some((r) => checked(r, p)) && !runs.some((r) => passes(r, p));
    case "all-pass":
      return runs.every((r) => passes(r, p));
    case "pair":
      return passes(promptFilter.a, p) && checked(promptFilter.b, p) && !passes(promptFilter.b, p);
    default:
      return true;
  }
}

function promptCell(run, p) {
  const sbs = IX.side_by_side;
  const n = sbs.checked[run][p];
  const c = sbs.passed[run][p];
  const samples = sbs.samples[run][p];
  let text = "–";
  let cls = "missing";
  if (n) {
    text = `${c}/${n}`;
    cls = c === n ? "pass-all" : c ? "pass-some" : "pass-none";
  } else if (samples) {
    text = "no check";
    cls = "nocheck";
  } else if (sbs.failed_attempts[run][p]) {
    text = "failed";
    cls = "failedonly";
  }
  return el("button", { class: "cell " + cls, text, title: `${DATA.runs[run].name}: ${text}`, data: { run, prompt: p }, onclick: () => showList({ run: String(run), prompt: String(p) }) });
}

function promptsView() {
  const runs = DATA.runs;
  const total = IX.prompts.text.length;
  let ids = [];
  const list = virtualList(ROW, (i) => {
    const p = ids[i];
    return el("div", { class: "row prompt-row", data: { prompt: p } }, runs.map((_, r) => promptCell(r, p)), el("span", { class: "text", text: cut(promptText(p), 200) }));
  });
  const count = el("p", { class: "count" });
  function refresh() {
    ids = [];
    for (let p = 0; p < total; p++) if (promptMatches(p)) ids.push(p);
    list.setCount(ids.length);
    count.textContent = `${fmtInt(ids.length)} of ${fmtInt(total)} prompts`;
    count.dataset.shown = ids.length;
    for (const b of buttons.querySelectorAll("button")) b.classList.toggle("on", b.dataset.which === key() || (b.dataset.which === "pair" && promptFilter.which === "pair"));
  }
  const key = () => (promptFilter.which === "pair" ? `pair-${promptFilter.a}-${promptFilter.b}` : promptFilter.which);
  const choose = (which, a, b) => () => {
    Object.assign(promptFilter, { which, a: a ?? promptFilter.a, b: b ?? promptFilter.b });
    refresh();
  };
  const quick = [
    ["all", "all prompts"],
    ["differ", "some runs pass, some do not"],
    ["all-pass", "every run passes"],
    ["none", "no run passes"],
  ].map(([which, text]) => el("button", { class: "chip", text, data: { which }, onclick: choose(which) }));
  const pairs = [];
  if (runs.length <= 4) {
    runs.forEach((ra, a) =>
      runs.forEach((rb, b) => {
        if (a !== b) pairs.push(el("button", { class: "chip", text: `${ra.name} passes, ${rb.name} does not`, data: { which: `pair-${a}-${b}` }, onclick: choose("pair", a, b) }));
      }),
    );
  } else {
    // Too many runs for a button per pair: two choices and one button.
    const pick = (name, value) => {
      const node = el("select", { name }, runs.map((r, i) => el("option", { value: i, text: r.name })));
      node.value = String(value);
      return node;
    };
    const a = pick("pass-a", promptFilter.a);
    const b = pick("pass-b", promptFilter.b);
    const go = el("button", { class: "chip", text: "show", data: { which: "pair" } });
    go.addEventListener("click", () => choose("pair", Number(a.value), Number(b.value))());
    pairs.push(el("span", { class: "pair-pick" }, a, " passes, ", b, " does not ", go));
  }
  const every = el("input", { type: "checkbox" });
  every.checked = promptFilter.everyRun;
  every.addEventListener("change", () => ((promptFilter.everyRun = every.checked), refresh()));
  const buttons = el("div", { class: "filter-line" }, quick, pairs);
  const head = el("div", { class: "row prompt-head" }, runs.map((r) => el("span", { class: "cell head", text: cut(r.name, 12), title: r.name })), el("span", { class: "text", text: "prompt" }));
  mount([
    el(
      "div",
      { class: "prompts-view" },
      section("Prompts by run", datasetNote(), note("Each cell: samples passed / samples checked in that run; a click lists those trajectories."), buttons, el("label", { class: "check" }, every, " only prompts every run has"), count, head),
      list.node,
    ),
  ]);
  refresh();
}
