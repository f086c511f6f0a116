// Draws each `.graph` from the JSON beside it: layout by dagre (vendored), SVG drawn here.
(function () {
  const NS = "http://www.w3.org/2000/svg";
  const COLORS = { succeeded: "#bbf7d0", failed: "#fecaca", cancelled: "#fde68a", running: "#bfdbfe",
    scheduled: "#bfdbfe", waiting: "#a5f3fc", retry_wait: "#f5d0fe", skipped: "#e5e7eb", pending: "#ffffff" };
  function el(name, attrs, parent) {
    const e = document.createElementNS(NS, name);
    for (const k in attrs) e.setAttribute(k, attrs[k]);
    if (parent) parent.appendChild(e);
    return e;
  }
  function draw(holder, data) {
    const g = new dagre.graphlib.Graph();
    g.setGraph({ rankdir: "LR", nodesep: 20, ranksep: 40, marginx: 8, marginy: 8 });
    g.setDefaultEdgeLabel(function () { return {}; });
    for (const n of data.nodes) {
      n.caption = n.status ? `${n.status}${n.instances > 1 ? " ×" + n.instances : ""}${n.attempts > n.instances ? " (" + n.attempts + " att.)" : ""}` : n.kind;
      g.setNode(n.id, { width: Math.max(90, 8 * n.id.length + 20, 6.5 * n.caption.length + 20), height: 44, data: n });
    }
    for (const e of data.edges) g.setEdge(e.from, e.to);
    dagre.layout(g);
    const size = g.graph();
    const svg = el("svg", { width: size.width, height: size.height, viewBox: `0 0 ${size.width} ${size.height}` });
    const marker = el("marker", { id: "arrow", viewBox: "0 0 10 10", refX: 10, refY: 5, markerWidth: 7,
      markerHeight: 7, orient: "auto-start-reverse" }, el("defs", {}, svg));
    el("path", { d: "M 0 0 L 10 5 L 0 10 z", fill: "#6b7280" }, marker);
    for (const id of g.edges()) {
      const pts = g.edge(id).points;
      el("path", { d: "M" + pts.map(p => `${p.x},${p.y}`).join(" L"), "marker-end": "url(#arrow)" }, svg);
    }
    for (const id of g.nodes()) {
      const n = g.node(id), d = n.data;
      const grp = el("g", { class: "node", "data-node": id, "data-status": d.status || "" }, svg);
      el("rect", { x: n.x - n.width / 2, y: n.y - n.height / 2, width: n.width, height: n.height,
        fill: COLORS[d.status] || "#ffffff" }, grp);
      const t = el("text", { x: n.x, y: n.y - 4, "text-anchor": "middle" }, grp);
      t.textContent = id;
      const s = el("text", { x: n.x, y: n.y + 12, "text-anchor": "middle", "font-size": "10" }, grp);
      s.textContent = d.caption;
    }
    holder.replaceChildren(svg);
  }
  function drawAll(root) {
    for (const script of root.querySelectorAll("script.graph-data")) {
      const holder = script.nextElementSibling;
      if (holder && holder.classList.contains("graph")) draw(holder, JSON.parse(script.textContent));
    }
  }
  document.addEventListener("DOMContentLoaded", function () { drawAll(document); });
  document.addEventListener("htmx:afterSwap", function (ev) { drawAll(ev.target); });
})();
