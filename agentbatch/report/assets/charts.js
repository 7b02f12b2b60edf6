// Charts as inline SVG: horizontal bars, lines (pass@k), histograms. Every mark carries its number in a
// <title> (shown on hover) and in data- attributes.

const CHART_WIDTH = 560;

function axisText(x, y, text, anchor, cls) {
  return svg("text", { x, y, "text-anchor": anchor || "middle", class: cls || "axis" }, text);
}

// rows: [{label, value, title?}]; one bar each, longest = the largest value.
function barChart(rows, format, opts = {}) {
  format = format || fmtInt;
  const rowH = 24;
  const labelW = opts.labelWidth || 190;
  const valueW = 90;
  const width = opts.width || CHART_WIDTH;
  const height = rows.length * rowH + 6;
  const max = Math.max(0, ...rows.map((r) => r.value || 0)) || 1;
  const span = width - labelW - valueW;
  const root = svg("svg", {
    class: "chart bars " + (opts.class || ""),
    viewBox: `0 0 ${width} ${height}`,
    width,
    height,
    role: "img",
    "aria-label": opts.label || "bar chart",
  });
  rows.forEach((r, i) => {
    const y = 3 + i * rowH;
    const w = Math.max(r.value > 0 ? 1 : 0, (span * (r.value || 0)) / max);
    root.append(
      svg(
        "g",
        { class: "bar " + (r.class || ""), data: { label: r.label, value: r.value } },
        svg("title", null, r.title || `${r.label}: ${format(r.value)}`),
        svg("text", { x: labelW - 8, y: y + rowH / 2 + 4, "text-anchor": "end", class: "label" }, cut(r.label, 28)),
        svg("rect", { x: labelW, y: y + 3, width: w.toFixed(2), height: rowH - 6, rx: 2 }),
        svg("text", { x: labelW + w + 6, y: y + rowH / 2 + 4, class: "value" }, format(r.value)),
      ),
    );
  });
  return root;
}

// series: [{name, points: [[x, y], ...]}]; y from 0 to yMax (1 for rates).
function lineChart(series, opts = {}) {
  const width = opts.width || CHART_WIDTH;
  const height = opts.height || 260;
  const m = { left: 48, right: 16, top: 14, bottom: 40 };
  const yMax = opts.yMax || 1;
  const format = opts.format || ((v) => fmtNum(v, 3));
  const xs = [...new Set(series.flatMap((s) => s.points.map((p) => p[0])))].sort((a, b) => a - b);
  const x0 = xs[0] ?? 0;
  const x1 = xs[xs.length - 1] ?? 1;
  const px = (x) => (x1 === x0 ? (m.left + width - m.right) / 2 : m.left + ((x - x0) / (x1 - x0)) * (width - m.left - m.right));
  const py = (y) => height - m.bottom - (y / yMax) * (height - m.top - m.bottom);
  const root = svg("svg", {
    class: "chart lines " + (opts.class || ""),
    viewBox: `0 0 ${width} ${height + 22 * Math.ceil(series.length / 3)}`,
    width,
    height: height + 22 * Math.ceil(series.length / 3),
    role: "img",
    "aria-label": opts.label || "line chart",
  });
  for (let i = 0; i <= 4; i++) {
    const v = (yMax * i) / 4;
    root.append(
      svg("line", { x1: m.left, x2: width - m.right, y1: py(v), y2: py(v), class: "grid" }),
      axisText(m.left - 6, py(v) + 4, format(v), "end"),
    );
  }
  const step = Math.max(1, Math.ceil(xs.length / 12));
  xs.forEach((x, i) => {
    if (i % step === 0 || i === xs.length - 1) root.append(axisText(px(x), height - m.bottom + 16, String(x)));
  });
  if (opts.xLabel) root.append(axisText((m.left + width) / 2, height - 6, opts.xLabel));
  const marks = [];
  series.forEach((s, i) => {
    const cls = "series s" + (i % 8) + (i === 0 ? " first" : "");
    const g = svg("g", { class: cls, data: { series: s.name } });
    if (s.points.length > 1) {
      g.append(svg("polyline", { points: s.points.map((p) => `${px(p[0]).toFixed(1)},${py(p[1]).toFixed(1)}`).join(" ") }));
    }
    for (const [x, y] of s.points) {
      g.append(
        svg(
          "circle",
          { cx: px(x).toFixed(1), cy: py(y).toFixed(1), r: 4, class: "point", data: { x, y } },
          svg("title", null, `${s.name}: ${opts.xName || "x"}=${x}: ${format(y)}`),
        ),
      );
    }
    marks.unshift(g); // the first series drawn last, on top of any it coincides with
    const lx = m.left + (i % 3) * 170;
    const ly = height + 8 + Math.floor(i / 3) * 22;
    root.append(
      svg("g", { class: cls + " legend" }, svg("rect", { x: lx, y: ly, width: 12, height: 12, rx: 2 }), axisText(lx + 18, ly + 10, cut(s.name, 22), "start", "label")),
    );
  });
  root.append(...marks);
  return root;
}

// A histogram: counts[i] samples in [edges[i], edges[i+1]).
function histogram(edges, counts, format, opts = {}) {
  format = format || ((v) => fmtNum(v, 2));
  const width = opts.width || CHART_WIDTH;
  const height = opts.height || 180;
  const m = { left: 48, right: 12, top: 10, bottom: 34 };
  const max = Math.max(1, ...counts);
  const bw = (width - m.left - m.right) / counts.length;
  const ph = height - m.top - m.bottom;
  const root = svg("svg", {
    class: "chart histogram " + (opts.class || ""),
    viewBox: `0 0 ${width} ${height}`,
    width,
    height,
    role: "img",
    "aria-label": opts.label || "histogram",
  });
  for (const v of [0, max / 2, max]) {
    const y = height - m.bottom - (v / max) * ph;
    root.append(svg("line", { x1: m.left, x2: width - m.right, y1: y, y2: y, class: "grid" }), axisText(m.left - 6, y + 4, fmtInt(Math.round(v)), "end"));
  }
  counts.forEach((n, i) => {
    const h = (n / max) * ph;
    const x = m.left + i * bw;
    const title = `${format(edges[i])} – ${format(edges[i + 1])}: ${plural(n, "sample")}`;
    root.append(
      svg(
        "g",
        { class: "bin", data: { lo: edges[i], hi: edges[i + 1], count: n } },
        svg("title", null, title),
        svg("rect", { x: (x + 1).toFixed(1), y: (height - m.bottom - h).toFixed(1), width: Math.max(1, bw - 2).toFixed(1), height: h.toFixed(1) }),
      ),
    );
  });
  const labels = counts.length > 10 || width < 400 ? [0, counts.length / 2, counts.length] : counts.map((_, i) => i).concat([counts.length]);
  for (const i of labels) root.append(axisText(m.left + i * bw, height - m.bottom + 16, format(edges[i])));
  if (opts.xLabel) root.append(axisText((m.left + width) / 2, height - 4, opts.xLabel));
  return root;
}
