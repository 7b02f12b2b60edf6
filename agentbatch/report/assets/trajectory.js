// One trajectory opened: its facts, check, usage, then its turns (reasoning folded, each tool call with its
// arguments and its result). All text is set as text.

const SHOWN_CHARS = 20000; // a longer text shows its start and a button for the rest

function textBlock(text, cls) {
  text = text === null || text === undefined ? "" : asText(text);
  const pre = el("pre", { class: "text " + (cls || "") });
  if (text.length <= SHOWN_CHARS) {
    pre.textContent = text;
    return pre;
  }
  pre.textContent = text.slice(0, SHOWN_CHARS);
  const more = el("button", {
    class: "link more",
    text: `show all ${fmtInt(text.length)} characters`,
    onclick: () => {
      pre.textContent = text;
      more.remove();
    },
  });
  return el("div", null, pre, more);
}

function facts(pairs) {
  return el(
    "dl",
    { class: "facts" },
    pairs.filter(([, v]) => v !== null && v !== undefined && v !== "").map(([k, v]) => [el("dt", { text: k }), el("dd", null, v instanceof Node ? v : asText(v))]),
  );
}

// A list of names as one text (a field of another shape, in a hand-edited line, as the text it is).
function names(list) {
  return Array.isArray(list) ? list.map(asText).join(", ") : list === null || list === undefined ? null : asText(list);
}

function splitThink(value) {
  if (value.startsWith("<think>\n")) {
    const end = value.indexOf("\n</think>\n", 8);
    if (end >= 0) return [value.slice(8, end), value.slice(end + 10)];
    if (value.endsWith("\n</think>")) return [value.slice(8, -9), ""];
  }
  return ["", value];
}

function parsedJSON(text) {
  try {
    return JSON.parse(text);
  } catch (e) {
    return undefined;
  }
}

// A JSON object's fields: text as it reads (a long or multi-line one as a block of its own), the rest as JSON.
function fieldsBlock(obj) {
  return Object.entries(obj).map(([k, v]) =>
    typeof v === "string" && (v.includes("\n") || v.length > 120)
      ? el("div", { class: "field" }, el("span", { class: "key", text: k }), textBlock(v, "output"))
      : el("div", { class: "field inline" }, el("span", { class: "key", text: k + ": " }), el("code", { text: typeof v === "string" ? v : JSON.stringify(v) })),
  );
}

function isObject(v) {
  return v !== null && typeof v === "object" && !Array.isArray(v);
}

function argumentsBlock(args) {
  const parsed = parsedJSON(args);
  if (!isObject(parsed)) return [el("div", { class: "sub", text: parsed === undefined ? "arguments (not JSON)" : "arguments" }), textBlock(args, "args")];
  return [el("div", { class: "sub", text: "arguments" }), el("div", { class: "args" }, fieldsBlock(parsed))];
}

// A tool result: an object's fields, else its text; failed when it is an object with an error.
function resultBlock(turn) {
  const parsed = parsedJSON(turn.value);
  const failed = isObject(parsed) && parsed.error;
  const label = el("div", { class: "sub" }, "result ", failed ? badge("failed", "bad") : badge("ok", "good"));
  if (!isObject(parsed)) return el("div", { class: "result" }, label, textBlock(turn.value, "output"));
  return el("div", { class: "result" + (failed ? " failed" : "") }, label, fieldsBlock(parsed));
}

function turnsView(turns) {
  const out = [];
  const used = new Set();
  let assistant = 0;
  turns.forEach((turn, i) => {
    if (used.has(i)) return;
    if (turn.from === "human") {
      out.push(el("div", { class: "turn human" }, el("div", { class: "who", text: i === 0 ? "prompt" : "user" }), textBlock(turn.value)));
    } else if (turn.from === "gpt") {
      assistant += 1;
      const [reasoning, content] = splitThink(turn.value);
      const calls = (turn.tool_calls || []).map((call) => {
        // Its result: the tool turn answering this call's id before the next assistant turn.
        let result = null;
        for (let j = i + 1; j < turns.length && turns[j].from !== "gpt"; j++) {
          if (turns[j].from === "tool" && !used.has(j) && turns[j].tool_call_id === call.id) {
            used.add(j);
            result = turns[j];
            break;
          }
        }
        return el(
          "div",
          { class: "call", data: { tool: call.name } },
          el("div", { class: "call-name" }, "tool call ", el("code", { text: call.name }), call.id ? el("span", { class: "muted", text: " " + call.id }) : null),
          argumentsBlock(call.arguments),
          result ? resultBlock(result) : el("div", { class: "sub", text: "no result" }),
        );
      });
      out.push(
        el(
          "div",
          { class: "turn gpt" },
          el("div", { class: "who", text: `assistant turn ${assistant}` + (turn.logprob_tokens ? ` · ${fmtInt(turn.logprob_tokens)} tokens with logprobs` : "") }),
          reasoning ? el("details", { class: "reasoning" }, el("summary", { text: `reasoning (${fmtInt(reasoning.length)} characters)` }), textBlock(reasoning)) : null,
          content ? textBlock(content, "content") : null,
          calls,
        ),
      );
    } else if (turn.from === "tool") {
      out.push(el("div", { class: "turn tool" }, el("div", { class: "who", text: "tool result " + (turn.name || "") + " (no matching call)" }), resultBlock(turn)));
    } else {
      out.push(el("div", { class: "turn other" }, el("div", { class: "who", text: String(turn.from) }), textBlock(turn.value)));
    }
  });
  return out;
}

function checkView(p) {
  const c = p.check && typeof p.check === "object" ? p.check : { status: "none" };
  const cls = c.status === "passed" ? "good" : c.status === "failed" ? "bad" : c.status === "none" ? "muted" : "warn";
  return section(
    "Check",
    el("p", null, badge(c.status === "failed" ? "not passed" : c.status, cls), " ", c.status === "none" ? "this row has no check" : ""),
    c.status === "none"
      ? null
      : facts([
          ["reward", p.reward === null || p.reward === undefined ? "none" : String(p.reward)],
          ["passed", String(p.passed)],
          ["exit code", c.exit_code === null ? "–" : String(c.exit_code)],
          ["answer matched", c.answer_matched === null || c.answer_matched === undefined ? "–" : String(c.answer_matched)],
          ["seconds", fmtNum(c.seconds, 2)],
        ]),
    c.output ? [el("div", { class: "sub", text: "output" }), textBlock(c.output, "check-output")] : null,
  );
}

function usageFacts(p, it) {
  const u = p.usage && typeof p.usage === "object" ? p.usage : {};
  return facts([
    ["prompt tokens", fmtInt(u.prompt_tokens ?? null)],
    ["completion tokens", fmtInt(u.completion_tokens ?? null)],
    ["total tokens", fmtInt(u.total_tokens ?? null)],
    ["cost", fmtCost(u.cost ?? null)],
    ["model calls", p.api_calls === undefined ? null : fmtInt(p.api_calls)],
    ["duration", it.seconds === null ? null : fmtSecs(it.seconds)],
  ]);
}

async function renderTrajectory(id, pane) {
  const it = item(id);
  pane.replaceChildren(note("Opening…"));
  let p;
  try {
    p = await payload(id);
  } catch (e) {
    pane.replaceChildren(note(String(e.message || e)));
    return;
  }
  if (selected !== id) return; // another was chosen meanwhile
  try {
    drawTrajectory(id, it, p, pane);
  } catch (e) {
    // A line of a shape no view expects (a hand edit, another tool): shown as the JSON it holds, never left opening.
    pane.replaceChildren(
      el("article", { class: "trajectory", data: { id } }, el("div", { class: "detail-head" }, el("h2", { text: `Prompt #${it.pindex ?? "?"} · sample ${it.sample}` }), el("p", { class: "muted", text: `${it.file}, line ${it.line}: a field of another shape (${e.message || e}); the line as it is:` })), textBlock(JSON.stringify(p, null, 2))),
    );
  }
}

function drawTrajectory(id, it, p, pane) {
  const [word, cls] = outcomeOf(it);
  const run = DATA.runs[it.run];
  const head = el(
    "div",
    { class: "detail-head" },
    el("h2", { text: `Prompt #${it.pindex ?? "?"} · sample ${it.sample}` + (DATA.runs.length > 1 ? " · run " + run.name : "") }),
    el("p", null, badge(word, cls), it.kind === "discarded" ? badge("discarded: " + (p.discard_reason || "?"), "warn") : null, it.stop ? badge(it.stop, "muted") : null, " ", el("span", { class: "muted", text: `${it.file}, line ${it.line}` })),
  );
  const meta = p.metadata && typeof p.metadata === "object" ? p.metadata : {};
  if (it.kind === "failed") {
    pane.replaceChildren(
      el("article", { class: "trajectory", data: { id } }, head, section("Error", textBlock(p.error, "error")), section("Prompt", textBlock(p.prompt)), section("Usage", usageFacts(p, it)), section("Attempt", facts([["model", p.model], ["timestamp", p.timestamp], ["batch", p.batch_num], ["toolsets", names(p.toolsets_used)]]))),
    );
    return;
  }
  const other = Object.entries(meta).filter(([k]) => !["model", "timestamp", "batch_num"].includes(k));
  pane.replaceChildren(
    el(
      "article",
      { class: "trajectory", data: { id } },
      head,
      facts([
        ["completed", String(p.completed)],
        ["partial", String(p.partial)],
        ["model", meta.model],
        ["finished", meta.timestamp],
        ["batch", meta.batch_num],
        ["toolsets", names(p.toolsets_used)],
        ["tools offered", names(p.tools_offered)],
        ["tool calls", Object.entries(p.tool_stats || {}).map(([n, s]) => `${n} ${s.count}` + (s.failure ? ` (${s.failure} failed)` : "")).join(", ")],
        ["row identity", typeof p.identity === "string" ? p.identity : null],
        ...other.map(([k, v]) => [k, typeof v === "string" ? v : JSON.stringify(v)]),
        ...Object.entries(p.extra || {}).map(([k, v]) => [k, typeof v === "string" ? v : JSON.stringify(v)]),
      ]),
      checkView(p),
      section("Usage", usageFacts(p, it)),
      section("Turns", turnsView(p.conversations || [])),
    ),
  );
}
