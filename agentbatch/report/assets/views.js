// The views of one run's figures: overview, tools, usage (tokens, cost, duration), discards and failures.

function card(label, value, figure, sub) {
  return el(
    "div",
    { class: "card", data: figure ? { figure } : null },
    el("div", { class: "card-label", text: label }),
    el("div", { class: "card-value", text: value }),
    sub ? el("div", { class: "card-sub", text: sub }) : null,
  );
}

function runMeta(r) {
  const c = r.checkpoint;
  const parts = [
    c.model && "model " + c.model,
    c.distribution && "distribution " + c.distribution,
    c.dataset_file && "dataset " + c.dataset_file,
    c.state && "state " + c.state,
    c.sessions != null && plural(c.sessions, "session"),
    c.updated_at && "updated " + c.updated_at,
  ].filter(Boolean);
  return el("p", { class: "meta" }, parts.join(" · "), el("br"), "directory " + r.path);
}

function overviewView(run) {
  const r = DATA.runs[run];
  const s = r.statistics;
  const o = s.outcomes;
  const p = s.samples;
  const k = Object.keys(o.pass_at_k).map(Number);
  const kMax = k.length ? Math.max(...k) : null;
  const skipped = Object.values(r.skipped).reduce((a, b) => a + b.not_json + b.malformed + b.unknown_tool, 0);
  const samples = o.samples_per_prompt > 1 ? ` (${o.samples_per_prompt} samples a prompt)` : "";
  const cards = el(
    "div",
    { class: "cards" },
    card("samples", p.total === null ? "?" : fmtInt(p.total), "samples", `done ${fmtInt(p.done)} · discarded ${fmtInt(p.discarded)} · failed ${fmtInt(p.failed)}` + (p.not_run === null ? "" : ` · not run ${fmtInt(p.not_run)}`)),
    card("trajectories", fmtInt(s.trajectories), "trajectories", `completed ${fmtInt(s.completed)} · partial ${fmtInt(s.partial)} · max turns ${fmtInt(s.max_turns_reached)}`),
    card("pass rate", fmtPct(o.pass_rate), "pass_rate", `${fmtInt(o.passed)} of ${fmtInt(o.checked)} checked samples`),
    card("mean reward", fmtNum(o.mean_reward), "mean_reward", o.unchecked ? `${fmtInt(o.unchecked)} samples without a check` : ""),
    card("pass@1", fmtNum(o.pass_at_k["1"]), "pass_at_1", kMax > 1 ? `pass@${kMax} ${fmtNum(o.pass_at_k[kMax])}` : `over ${plural(o.prompts_checked, "prompt")}`),
    card("tokens", fmtInt(s.tokens.total.total_tokens), "tokens", `${fmtInt(s.tokens.total.prompt_tokens)} prompt · ${fmtInt(s.tokens.total.completion_tokens)} completion`),
    card("cost", fmtCost(s.cost.total), "cost", `${fmtCost(s.cost.per_completed)} per completed` + (s.cost.per_passing != null ? ` · ${fmtCost(s.cost.per_passing)} per pass` : "")),
    card("duration", fmtSecs(r.checkpoint.duration_seconds), "duration", `${fmtInt(s.api_calls)} model calls`),
    card("reasoning", fmtPct(s.reasoning.coverage), "reasoning", `${fmtInt(s.reasoning.with_reasoning)} of ${fmtInt(s.reasoning.assistant_turns)} assistant turns`),
    card("lines skipped", fmtInt(skipped), "skipped", "torn or not records: see Discards & failures"),
  );
  const reasons = Object.entries(s.stop_reasons).map(([label, value]) => ({ label, value }));
  const models = Object.entries(s.by_model).map(([name, g]) => [name, fmtInt(g.trajectories), fmtInt(g.completed), fmtInt(g.discarded), fmtInt(g.failed_attempts), fmtInt(g.tokens), fmtCost(g.cost), fmtCost(g.cost_per_completed)]);
  return [
    section("Run " + r.name + samples, runMeta(r), cards),
    section(
      "Stop reasons",
      note("How each sample ended: the kept trajectories by their stop reason, and error for each sample whose last attempt failed."),
      reasons.length ? barChart(reasons, fmtInt, { class: "stop-reasons", label: "stop reasons" }) : note("No sample has ended yet."),
    ),
    section("By model", table(["model", "trajectories", "completed", "discarded", "failed attempts", "tokens", "cost", "per completed"], models)),
  ];
}

function toolsView(run) {
  const r = DATA.runs[run];
  const used = Object.entries(r.statistics.tools)
    .filter(([, t]) => t.count)
    .sort((a, b) => b[1].count - a[1].count);
  if (!used.length) return [section("Tools", note("No tool was called in this run."))];
  const rates = used.map(([name, t]) => ({ label: name, value: t.failure / t.count, title: `${name}: ${t.failure} of ${t.count} calls failed` }));
  const rows = used.map(([name, t]) => [
    el("code", { text: name }),
    fmtInt(t.count),
    fmtInt(t.success),
    t.failure ? el("button", { class: "link", text: fmtInt(t.failure), title: "the trajectories where it failed", onclick: () => showList({ tool: name, run }) }) : "0",
    fmtPct(t.failure / t.count),
    el("ul", { class: "errors" }, (r.tool_errors[name] || []).map(([text, n]) => el("li", null, el("span", { class: "count", text: "×" + fmtInt(n) }), " ", text))),
  ]);
  return [
    section("Failure rate by tool", barChart(rates, (v) => fmtPct(v), { class: "tool-failures", label: "failure rate by tool" })),
    section("Tools", note("Calls, failures and the most common error texts their results gave."), table(["tool", "calls", "ok", "failed", "failure rate", "most common errors"], rows, "tools")),
  ];
}

function distributionPanel(title, field, d, opts = {}) {
  if (!d || !d.max) return section(title, note(opts.none || "Not recorded."));
  const format = (v) => fmtValue(field, v);
  return section(
    title,
    el("p", { class: "quantiles", data: { field } }, `${plural(d.count, "sample")} · total ${format(d.total)} · mean ${format(d.mean)} · median ${format(d.p50)} · p90 ${format(d.p90)} · p99 ${format(d.p99)} · max ${format(d.max)}`),
    histogram(d.edges, d.bins, format, { class: "dist-" + field, label: title }),
  );
}

function topList(ids, field) {
  return table(
    ["", "prompt", "tokens", "cost", field === "seconds" ? "duration" : "model calls", "stop"],
    ids.map((id) => {
      const it = item(id);
      return [
        el("button", { class: "link", text: itemLabel(it), onclick: () => openItem(id) }),
        cut(promptText(it.prompt), 90),
        fmtInt(it.tokens),
        fmtCost(it.cost),
        field === "seconds" ? fmtSecs(it.seconds) : fmtInt(it.calls),
        it.stop || it.kind,
      ];
    }),
    "top",
  );
}

function usageView(run) {
  const r = DATA.runs[run];
  const s = r.statistics;
  const u = r.usage;
  const groups = (obj) => Object.entries(obj).map(([name, g]) => [name, fmtInt(g.trajectories), fmtInt(g.tokens), fmtCost(g.cost), fmtCost(g.cost_per_completed), fmtCost(g.cost_per_passing)]);
  const t = s.tokens;
  const split = ["trajectories", "discarded", "failed_attempts", "total"].map((k) => [k.replace("_", " "), fmtInt(t[k].prompt_tokens), fmtInt(t[k].completion_tokens), fmtInt(t[k].total_tokens), fmtCost(s.cost[k])]);
  return [
    distributionPanel("Tokens per sample", "tokens", u.tokens),
    distributionPanel("Cost per sample", "cost", u.cost, {
      none: "No cost was recorded: the endpoint reported none and no --price_input or --price_output was given.",
    }),
    distributionPanel("Duration per sample", "seconds", u.seconds, {
      none: "These lines do not record how long each sample took (a line's duration_seconds); the run took " + fmtSecs(r.checkpoint.duration_seconds) + " in all.",
    }),
    section(u.costliest_by === "cost" ? "Costliest samples" : "Samples with the most tokens (no cost recorded)", topList(u.costliest, "cost")),
    section(u.slowest_by === "seconds" ? "Slowest samples" : "Samples with the most model calls (no duration recorded)", topList(u.slowest, u.slowest_by)),
    section("Tokens and cost by kind", table(["", "prompt tokens", "completion tokens", "total", "cost"], split)),
    section("By toolset", note("A sample counts under every toolset it was offered, so toolsets overlap."), table(["toolset", "trajectories", "tokens", "cost", "per completed", "per pass"], groups(s.by_toolset))),
  ];
}

function problemsView(run) {
  const r = DATA.runs[run];
  const s = r.statistics;
  const reasons = Object.entries(s.discard_reasons).map(([label, value]) => ({ label, value }));
  const [from, to] = r.items;
  let attempts = 0;
  for (let id = from; id < to; id++) attempts += IX.columns.kind[id] === 2;
  const skippedRows = Object.entries(r.skipped).map(([kind, c]) => [kind === "trajectory" ? "batch files" : kind + ".jsonl", fmtInt(c.not_json), fmtInt(c.malformed), kind === "trajectory" ? fmtInt(c.unknown_tool) : "–"]);
  return [
    section(
      "Discarded samples",
      el("p", null, plural(s.discarded, "sample") + " discarded by the quality filters. ", s.discarded ? el("button", { class: "link", text: "Show them", onclick: () => showList({ kind: "discarded", run }) }) : null),
      reasons.length ? barChart(reasons, fmtInt, { class: "discard-reasons", label: "discard reasons" }) : null,
    ),
    section(
      "Failed attempts",
      el(
        "p",
        null,
        `${plural(attempts, "failed attempt")}; ${plural(s.samples.failed, "sample")} whose last attempt failed (no trajectory). `,
        attempts ? el("button", { class: "link", text: "Show them", onclick: () => showList({ kind: "failed", run }) }) : null,
      ),
      r.failure_errors.length ? table(["error", "attempts"], r.failure_errors.map(([text, n]) => [text, fmtInt(n)]), "failures") : null,
      r.failure_errors_distinct > r.failure_errors.length ? note(`${r.failure_errors_distinct - r.failure_errors.length} more distinct errors.`) : null,
    ),
    section(
      "Lines skipped",
      note("Lines that are not JSON (a write cut by a kill), JSON of another shape than the file's records, or trajectories calling a tool of no toolset are left out, as the merge leaves them out of trajectories.jsonl."),
      table(["file", "not JSON", "wrong shape", "unknown tool"], skippedRows, "skipped"),
    ),
  ];
}

function artifactsView(run) {
  // The files each sample's check kept (a Harbor task's artifacts), in the run directory beside this page.
  const rows = (DATA.runs[run].artifacts || []).map(([prompt, sample, folder, files]) => [
    `prompt ${prompt}, sample ${sample}`,
    el("span", null, files.map((f) => el("a", { class: "artifact", href: encodeURI(`${folder}/${f}`), text: f })).flatMap((a) => [a, " "])),
  ]);
  return [
    section(
      "Artifacts",
      note("Files the checks kept, one folder per sample (artifacts/<prompt>-<sample>/ in the run directory; manifest.json says what each entry collected). The links open them from there."),
      rows.length ? table(["sample", "files"], rows, "artifacts") : el("p", null, "No sample of this run kept files."),
    ),
  ];
}
