// The outcomes of checked samples: counts, pass@k curves and reward histograms, overall, by toolset and by
// task category (statistics.json's "outcomes", and the same figures per category).

function passAtSeries(name, figures) {
  const points = Object.entries(figures.pass_at_k).map(([k, v]) => [Number(k), v]);
  return { name, points };
}

function outcomeGroups(r) {
  const o = r.statistics.outcomes;
  const groups = [["all samples", o, "overall"]];
  for (const [t, f] of Object.entries(o.by_toolset)) if (f.checked) groups.push(["toolset " + t, f, "toolset"]);
  for (const [field, values] of Object.entries(r.by_category || {})) {
    for (const [v, f] of Object.entries(values)) if (f.checked) groups.push([field + ": " + v, f, "category"]);
  }
  return groups;
}

function outcomesTable(groups) {
  const ks = [...new Set(groups.flatMap(([, f]) => Object.keys(f.pass_at_k).map(Number)))].sort((a, b) => a - b);
  const head = ["", "checked", "passed", "pass rate", "mean reward", "timeouts", "could not run", ...ks.map((k) => "pass@" + k), "prompts", "tokens per pass"];
  const rows = groups.map(([name, f]) => [
    name,
    fmtInt(f.checked),
    fmtInt(f.passed),
    fmtPct(f.pass_rate),
    fmtNum(f.mean_reward),
    fmtInt(f.timeout),
    fmtInt(f.error),
    ...ks.map((k) => el("td", { data: { k, value: f.pass_at_k[k] ?? "" }, text: fmtNum(f.pass_at_k[k]) })),
    fmtInt(f.prompts_checked),
    fmtInt(f.tokens_per_pass === null ? null : Math.round(f.tokens_per_pass)),
  ]);
  return table(head, rows, "outcomes");
}

function outcomesView(run) {
  const r = DATA.runs[run];
  const o = r.statistics.outcomes;
  if (!o || !(o.checked || o.timeout || o.error)) {
    return [section("Outcomes", note("No sample of this run had a check: rows with verify or answer give one (README, \"Verified outcomes\")."))];
  }
  const counts = [
    { label: "passed", value: o.passed, class: "good" },
    { label: "not passed", value: o.not_passed, class: "bad" },
    { label: "timed out", value: o.timeout, class: "warn" },
    { label: "could not run", value: o.error, class: "warn" },
    { label: "without a check", value: o.unchecked, class: "muted" },
  ];
  const groups = outcomeGroups(r);
  const byToolset = groups.filter((g) => g[2] !== "category");
  const byCategory = groups.filter((g) => g[2] === "category");
  const out = [
    section("Checks", barChart(counts, fmtInt, { class: "check-counts", label: "check results" }), note("pass rate = passed ÷ checked; timeouts and checks that could not run have no result and count apart.")),
    section(
      "pass@k",
      note(`The chance that k samples of a prompt hold at least one pass (the unbiased estimator of Chen et al., 2021), averaged over the prompts with at least k checked samples (${plural(o.prompts_checked, "prompt")}).`),
      lineChart(byToolset.map(([name, f]) => passAtSeries(name, f)), { xLabel: "k (samples)", xName: "k", label: "pass@k", class: "pass-at-k" }),
      byCategory.length ? lineChart(byCategory.map(([name, f]) => passAtSeries(name, f)), { xLabel: "k (samples), by task category", xName: "k", label: "pass@k by category", class: "pass-at-k-category" }) : null,
      outcomesTable(groups),
    ),
  ];
  const h = r.rewards;
  if (h && h.all) {
    const fmt = (v) => fmtNum(v, 2);
    const small = [];
    for (const [name, counts] of Object.entries(h.by_toolset)) small.push(["toolset " + name, counts]);
    for (const [name, counts] of Object.entries(h.by_category)) small.push([name, counts]);
    out.push(
      section(
        "Rewards",
        note("Checked samples with a result, by reward (a pass without a printed reward is 1, a fail 0)."),
        histogram(h.edges, h.all, fmt, { class: "rewards", label: "reward histogram", xLabel: "reward" }),
        small.length > 1
          ? el("div", { class: "multiples" }, small.map(([name, counts]) => el("figure", null, el("figcaption", { text: name }), histogram(h.edges, counts, fmt, { width: 300, height: 130, label: name }))))
          : null,
      ),
    );
  }
  return out;
}
