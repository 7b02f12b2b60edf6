"""The JavaScript the browser tools run in the page: the snapshot with its element refs, images, scrolling."""

SNAPSHOT_JS = r"""
([start, maxChars]) => {
  const ATTR = "data-br-ref";
  const SKIP = new Set(["SCRIPT", "STYLE", "NOSCRIPT", "TEMPLATE", "HEAD", "META", "LINK"]);
  const ROLES = new Set(["button", "link", "checkbox", "radio", "switch", "tab", "menuitem", "menuitemcheckbox",
    "menuitemradio", "option", "textbox", "searchbox", "combobox", "slider", "spinbutton", "treeitem"]);
  const NATIVE = new Set(["A", "BUTTON", "INPUT", "SELECT", "TEXTAREA", "SUMMARY"]);
  let next = start, count = 0, size = 0, truncated = false;
  const seen = new Set(), lines = [];
  let line = [];
  const clip = (s, n) => { s = (s || "").replace(/\s+/g, " ").trim(); return s.length > n ? s.slice(0, n) + "…" : s; };
  const flush = () => {
    const t = line.join(" ").replace(/\s+/g, " ").trim();
    line = [];
    if (!t || truncated) return;
    if (size + t.length > maxChars) { truncated = true; return; }
    lines.push(t); size += t.length + 1;
  };
  const interactive = (el) => {
    const tag = el.tagName;
    if (tag === "A") return el.hasAttribute("href") || el.hasAttribute("onclick");
    if (tag === "INPUT") return el.type !== "hidden";
    if (NATIVE.has(tag)) return true;
    if (ROLES.has((el.getAttribute("role") || "").toLowerCase())) return true;
    if (el.hasAttribute("onclick") || el.onclick) return true;
    if (el.isContentEditable && !(el.parentElement && el.parentElement.isContentEditable)) return true;
    const ti = el.getAttribute("tabindex");
    return ti !== null && Number(ti) >= 0 && tag !== "BODY" && tag !== "HTML";
  };
  const stamp = (el) => {
    let ref = el.getAttribute(ATTR);
    if (!ref || seen.has(ref)) { ref = "e" + next++; el.setAttribute(ATTR, ref); }
    seen.add(ref); count++;
    return ref;
  };
  const labelOf = (el) => {
    const aria = el.getAttribute("aria-label");
    if (aria) return aria;
    const by = el.getAttribute("aria-labelledby");
    if (by) {
      const t = by.split(/\s+/).map((id) => document.getElementById(id)).filter(Boolean).map((n) => n.innerText).join(" ");
      if (t.trim()) return t;
    }
    if (el.labels && el.labels.length) return Array.from(el.labels).map((l) => l.innerText).join(" ");
    return "";
  };
  const describe = (el, ref) => {
    const tag = el.tagName;
    const role = (el.getAttribute("role") || "").toLowerCase();
    const parts = [];
    let kind, name = labelOf(el);
    if (tag === "A") {
      kind = role || "link";
      name = name || el.innerText || (el.querySelector("img") || {}).alt || el.title;
    } else if (tag === "INPUT") {
      const type = (el.type || "text").toLowerCase();
      if (["submit", "button", "reset", "image"].includes(type)) { kind = "button"; name = name || el.value || el.alt || type; }
      else if (type === "checkbox" || type === "radio") { kind = type; if (el.checked) parts.push("checked"); }
      else {
        kind = type === "text" ? "textbox" : type + " input";
        name = name || el.placeholder || el.title;
        if (el.value && type !== "password") parts.push(`value="${clip(el.value, 80)}"`);
        if (el.placeholder && name !== el.placeholder) parts.push(`placeholder="${clip(el.placeholder, 40)}"`);
      }
      if (el.name) parts.push(`name=${clip(el.name, 30)}`);
    } else if (tag === "SELECT") {
      kind = "select";
      const opts = Array.from(el.options).slice(0, 25).map((o) => clip(o.text, 30) + (o.selected ? "*" : ""));
      parts.push("options: " + opts.join(" | ") + (el.options.length > 25 ? " | …" : ""));
    } else if (tag === "TEXTAREA") {
      kind = "textarea"; name = name || el.placeholder;
      if (el.value) parts.push(`value="${clip(el.value, 120)}"`);
    } else {
      kind = role || (tag === "BUTTON" ? "button" : tag === "SUMMARY" ? "summary" : el.isContentEditable ? "editable" : "clickable");
      name = name || (NATIVE.has(tag) ? el.innerText : "") || el.title;
    }
    if (el.disabled) parts.push("disabled");
    if (tag === "A" && el.getAttribute("href")) parts.push("-> " + clip(el.getAttribute("href"), 100));
    return `[${ref}] ${kind}${name ? ` "${clip(name, 80)}"` : ""}${parts.length ? " " + parts.join(" ") : ""}`;
  };
  const walk = (node) => {
    if (truncated) return;
    if (node.nodeType === Node.TEXT_NODE) {
      const p = node.parentElement;
      if (p && getComputedStyle(p).visibility !== "hidden") line.push(node.textContent);
      return;
    }
    if (node.nodeType !== Node.ELEMENT_NODE) {
      if (node.nodeType === Node.DOCUMENT_FRAGMENT_NODE) node.childNodes.forEach(walk);
      return;
    }
    const el = node;
    if (SKIP.has(el.tagName) || el.hidden || el.getAttribute("aria-hidden") === "true") return;
    const style = getComputedStyle(el);
    if (style.display === "none") return;
    const block = !style.display.startsWith("inline") || el.tagName === "BR";
    if (block) flush();
    const heading = /^H([1-6])$/.exec(el.tagName);
    if (heading) line.push("#".repeat(Number(heading[1])));
    else if (el.tagName === "LI") line.push("-");
    if (el.tagName === "IFRAME") { line.push(`[frame ${clip(el.src, 100)}]`); flush(); return; }
    if (el.tagName === "IMG" && el.alt && !el.closest("a,button")) line.push(`image "${clip(el.alt, 80)}"`);
    if (style.visibility !== "hidden" && interactive(el)) {
      line.push(describe(el, stamp(el)));
      if (NATIVE.has(el.tagName)) { if (block) flush(); return; }
    }
    if (el.shadowRoot) walk(el.shadowRoot);
    el.childNodes.forEach(walk);
    if (block) flush();
  };
  if (document.body) walk(document.body);
  flush();
  return { text: lines.join("\n"), next, count, truncated };
}
"""

# A navigation returns at DOMContentLoaded, before the page's images have loaded (naturalWidth 0 until then): wait up
# to `waitMs` for those still loading, lazy ones apart (one below the fold loads only when scrolled to).
IMAGES_JS = """
async ([limit, waitMs]) => {
  const images = Array.from(document.images).slice(0, limit);
  const loading = images.filter((img) => !img.complete && img.loading !== "lazy");
  if (loading.length) {
    const loaded = (img) => new Promise((done) => {
      img.addEventListener("load", done, { once: true });
      img.addEventListener("error", done, { once: true });
    });
    await Promise.race([Promise.all(loading.map(loaded)), new Promise((done) => setTimeout(done, waitMs))]);
  }
  return images.map((img) => ({
    url: (img.currentSrc || img.src || "").slice(0, 500),
    alt: img.alt || "",
    width: img.naturalWidth,
    height: img.naturalHeight,
  })).filter((i) => i.url);
}
"""

# Scroll events fire on the next frame: wait two frames (and a beat for timers) so that content a page adds
# on scroll (infinite lists, "load more") is there for the next snapshot.
SCROLL_JS = """
async (dy) => { window.scrollBy(0, dy * window.innerHeight * 0.8);
  await new Promise(r => requestAnimationFrame(() => requestAnimationFrame(() => setTimeout(r, 50))));
  const el = document.scrollingElement || document.documentElement;
  return { scroll_y: Math.round(window.scrollY), page_height: el.scrollHeight, viewport_height: window.innerHeight }; }
"""
