// The page: a header with the views, the run shown (of several), and the view the address names.

const app = document.getElementById("app");
const state = { run: 0, view: "" };
const VIEWS = [
  ["compare", "Side by side", () => compareView(), true],
  ["prompts", "Prompts", null, true],
  ["overview", "Overview", (run) => overviewView(run)],
  ["outcomes", "Outcomes", (run) => outcomesView(run)],
  ["tools", "Tools", (run) => toolsView(run)],
  ["usage", "Tokens, cost, time", (run) => usageView(run)],
  ["problems", "Discards & failures", (run) => problemsView(run)],
  ["artifacts", "Artifacts", (run) => artifactsView(run), false, true],
  ["trajectories", "Trajectories", null],
].filter(([, , , multi, files]) => (!multi || DATA.runs.length > 1) && (!files || DATA.runs.some((r) => (r.artifacts || []).length)));
let content = null;
let nav = null;

function mount(children) {
  content.replaceChildren(...children.flat().filter(Boolean));
}

function header() {
  nav = el(
    "nav",
    { class: "tabs" },
    VIEWS.map(([id, label]) => el("button", { class: "tab", data: { view: id }, text: label, onclick: () => (location.hash = "#" + id) })),
  );
  const runPick =
    DATA.runs.length > 1
      ? el(
          "label",
          { class: "run-pick" },
          "run shown ",
          el(
            "select",
            { name: "run-shown", onchange: (e) => ((state.run = Number(e.target.value)), route(true)) },
            DATA.runs.map((r, i) => el("option", { value: i, text: r.name })),
          ),
        )
      : null;
  return el(
    "header",
    null,
    el("div", { class: "title" }, el("h1", { text: DATA.title }), el("span", { class: "muted", text: `${plural(DATA.items, "line")} · written ${DATA.generated_at} UTC` }), runPick),
    nav,
  );
}

function route(force) {
  const [view, arg] = location.hash.replace(/^#/, "").split("/");
  const known = VIEWS.some(([id]) => id === view);
  const target = known ? view : VIEWS[0][0];
  for (const b of nav.querySelectorAll(".tab")) b.classList.toggle("on", b.dataset.view === target);
  const id = arg === undefined || arg === "" ? undefined : Number(arg);
  if (target === "trajectories") {
    if (state.view === "trajectories" && !force && list) {
      if (id !== undefined) showItem(id);
    } else {
      state.view = target;
      renderBrowser(id);
    }
    return;
  }
  state.view = target;
  list = null;
  if (target === "prompts") return promptsView();
  const [, , render] = VIEWS.find(([v]) => v === target);
  mount(render(state.run));
  window.scrollTo(0, 0);
}

async function start() {
  // Plain JSON, read at once: decoding it through a stream would wait behind the parsing of the chunks.
  IX = JSON.parse(document.getElementById("report-index").textContent);
  performance.mark("report-index");
  content = el("main", { id: "content" });
  app.replaceChildren(header(), content);
  window.addEventListener("hashchange", () => route(false));
  route(false);
  performance.mark("report-ready");
  document.body.dataset.ready = "1";
}

start().catch((e) => {
  app.replaceChildren(el("p", { class: "error", text: "The report could not be drawn: " + (e && e.message ? e.message : e) }));
  throw e;
});
