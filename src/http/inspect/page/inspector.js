// foldgate's session inspector: the sessions table and, for one session (#session=KEY),
// its chart of prompt tokens per request (folds, cuts and drops marked), every change
// each request made (what was stubbed, folded or dropped, with its size before and
// after), what the provider's cache did with it, and its digests. Plain DOM, no
// dependencies.
// The admin token, when one is needed, is asked for once and kept in sessionStorage
// (or given in the fragment as #token=..., which never reaches a server).
"use strict";

(function () {
  const SVG = "http://www.w3.org/2000/svg";
  let token = sessionStorage.getItem("foldgate-admin-token") || "";

  function fragment() {
    return new URLSearchParams(location.hash.slice(1));
  }

  function el(tag, attrs, ...children) {
    const node = tag.startsWith("svg:")
      ? document.createElementNS(SVG, tag.slice(4))
      : document.createElement(tag);
    for (const [name, value] of Object.entries(attrs || {})) {
      if (value !== undefined && value !== null) node.setAttribute(name, String(value));
    }
    for (const child of children) {
      if (child === null || child === undefined) continue;
      node.append(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return node;
  }

  function time(ms) {
    return ms ? new Date(ms).toISOString().replace("T", " ").slice(0, 19) + " UTC" : "–";
  }

  function api(path, options) {
    const headers = token ? { authorization: "Bearer " + token } : {};
    return fetch(path, Object.assign({ headers: headers, cache: "no-store" }, options || {}))
      .then(function (response) {
        if (response.status === 401) {
          document.getElementById("auth").hidden = false;
          throw new Error("the admin token is needed");
        }
        return response.json().then(function (body) {
          if (!response.ok) throw new Error((body.error && body.error.message) || response.status);
          return body;
        });
      });
  }

  function loadList() {
    const status = document.getElementById("list-status");
    return api("sessions").then(function (body) {
      const rows = document.querySelector("#sessions tbody");
      rows.replaceChildren();
      const current = fragment().get("session");
      for (const s of body.sessions) {
        const link = el("a", { href: "#session=" + s.key }, el("code", {}, s.key.slice(0, 12) + "…"));
        rows.append(el("tr", { class: s.key === current ? "current" : null, "data-key": s.key },
          el("td", {}, link),
          el("td", {}, s.model || "–"),
          el("td", {}, time(s.last_seen)),
          el("td", { class: "num" }, s.requests),
          el("td", { class: "num" }, s.tokens_before + " → " + s.tokens_after),
          el("td", { class: "num" }, s.folds),
          el("td", { class: "num" }, s.drops),
          el("td", { class: "num" }, s.tiers.join(" · "))));
      }
      status.textContent = body.sessions.length + " session(s)";
    }).catch(function (e) {
      status.textContent = String(e.message || e);
      status.className = "status error";
    });
  }

  function usageText(u) {
    if (!u) return "";
    const uncached = Math.max(0, u.prompt - u.cache_read - u.cache_write);
    return "upstream: " + u.prompt + " prompt (" + uncached + " uncached, " + u.cache_read +
      " cache read, " + u.cache_write + " cache write), " + u.completion + " completion";
  }

  function requestLabel(r) {
    const cuts = r.stubbed || 0;
    return "request #" + r.n + " (" + time(r.at) + "): " + r.tokens_before + " → " +
      r.tokens_after + " tokens, tier " + r.tier + ", " + r.outcome +
      (r.why ? " (" + r.why + ")" : "") +
      (r.wait_ms ? ", waited " + r.wait_ms + " ms" : "") +
      (r.folds ? ", " + r.folds + " fold(s)" : "") + (cuts ? ", " + cuts + " message(s) stubbed" : "") +
      (r.dropped ? ", " + r.dropped + " dropped" : "") +
      (r.rewritten ? ", " + r.rewritten + " tokens written to the cache again" : "") +
      (r.usage ? "; " + usageText(r.usage) : "") +
      (r.api ? ", served " + r.api.replace(/_/g, " ") : "");
  }

  function chart(svg, requests) {
    svg.replaceChildren();
    const width = 1000, height = 300, left = 56, right = 16, top = 16, bottom = 28;
    svg.setAttribute("viewBox", "0 0 " + width + " " + height);
    svg.setAttribute("data-points", requests.length);
    const max = Math.max(1, ...requests.map((r) => Math.max(r.tokens_before, r.tokens_after)));
    const n = requests.length;
    const x = (i) => left + (n <= 1 ? (width - left - right) / 2 : (i * (width - left - right)) / (n - 1));
    const y = (v) => top + (height - top - bottom) * (1 - v / max);
    svg.append(el("svg:line", { class: "axis", x1: left, y1: y(0), x2: width - right, y2: y(0) }));
    svg.append(el("svg:line", { class: "axis", x1: left, y1: top, x2: left, y2: y(0) }));
    for (const v of [0, Math.round(max / 2), max]) {
      svg.append(el("svg:text", { class: "tick", x: left - 6, y: y(v) + 4, "text-anchor": "end" }, v));
    }
    const step = Math.max(1, Math.ceil(n / 10));
    requests.forEach(function (r, i) {
      if (i % step === 0 || i === n - 1) {
        svg.append(el("svg:text", { class: "tick", x: x(i), y: height - 8, "text-anchor": "middle" }, "#" + r.n));
      }
      if (r.folds > 0) {
        svg.append(el("svg:line", { class: "mark-fold", x1: x(i), y1: top, x2: x(i), y2: y(0), "data-request": r.n }));
        svg.append(el("svg:text", { class: "mark-fold-label", x: x(i) + 3, y: top + 10 }, "fold"));
      }
    });
    for (const [series, field] of [["before", "tokens_before"], ["after", "tokens_after"]]) {
      const points = requests.map((r, i) => x(i).toFixed(1) + "," + y(r[field]).toFixed(1)).join(" ");
      svg.append(el("svg:polyline", { class: "line-" + series, points: points }));
    }
    requests.forEach(function (r, i) {
      const label = requestLabel(r);
      svg.append(el("svg:circle", { class: "pt pt-before", cx: x(i), cy: y(r.tokens_before), r: 2.5 }, el("svg:title", {}, label)));
      svg.append(el("svg:circle", { class: "pt pt-after", cx: x(i), cy: y(r.tokens_after), r: 3.5, "data-request": r.n }, el("svg:title", {}, label)));
      const cx = x(i);
      if (r.dropped > 0) {
        const cy = y(r.tokens_after) - 8;
        svg.append(el("svg:path", { class: "mark-drop", "data-request": r.n, d: "M" + (cx - 4) + "," + (cy - 6) + " L" + (cx + 4) + "," + (cy - 6) + " L" + cx + "," + cy + " Z" }, el("svg:title", {}, label)));
      }
      if (r.stubbed > 0) {
        const cy = y(r.tokens_after) + 9;
        svg.append(el("svg:rect", { class: "mark-cut", "data-request": r.n, x: cx - 3.5, y: cy - 3.5, width: 7, height: 7 }, el("svg:title", {}, label)));
      }
    });
  }

  function blocks(box, session) {
    box.replaceChildren();
    if (!session.blocks.length) {
      box.append(el("p", { class: "status" }, "No fold blocks (yet)."));
      return;
    }
    const total = Math.max(session.messages, ...session.blocks.map((b) => b.end), 1);
    for (const b of session.blocks) {
      const bar = el("div", { class: "bar" }, el("i"));
      bar.firstChild.style.left = (100 * b.start / total) + "%";
      bar.firstChild.style.width = Math.max(1, 100 * (b.end - b.start) / total) + "%";
      const recall = b.artifact_recall === null || b.artifact_recall === undefined
        ? "–" : Math.round(100 * b.artifact_recall) + "%";
      box.append(el("div", { class: "block", "data-start": b.start, "data-end": b.end },
        el("div", { class: "range" },
          el("b", {}, "messages " + b.start + "–" + (b.end - 1)),
          bar,
          el("div", { class: "meta" }, (b.end - b.start) + " message(s) replaced; " +
            b.verbatim.length + " kept verbatim"),
          el("div", { class: "meta" }, "by " + (b.summarizer || "–") +
            "; the summarizer's own text named " + recall +
            " of the fold's files, commands and errors (the work trail below lists every one)"),
          el("div", { class: "meta" }, "folded " + time(b.folded_at))),
        el("pre", { class: "digest" }, b.digest),
        el("details", { class: "trail" },
          el("summary", {}, "work trail up to this fold: " + (b.trail || []).length + " entries"),
          el("pre", {}, (b.trail || []).join("\n")))));
    }
  }

  const CHANGED = { elided: "stubbed", folded: "folded into a digest", dropped: "not forwarded" };

  function messages(c) {
    return c.end - c.start === 1 ? "message " + c.start : "messages " + c.start + "–" + (c.end - 1);
  }

  // Every request with a change, newest first: why its tier, what the provider's cache
  // did, and each change with its size before and after and the text put in its place.
  function changes(box, session) {
    box.replaceChildren();
    const changed = session.recent.filter((r) => (r.changes && r.changes.length) || r.why || r.usage ||
      (r.instructions && r.instructions.length) || (r.pinned && r.pinned.length));
    if (!changed.length) {
      box.append(el("p", { class: "status" }, "No request changed (yet)."));
      return;
    }
    for (const r of changed.slice().reverse()) {
      const items = el("ul", { class: "changes" });
      for (const c of r.changes || []) {
        items.append(el("li", { class: "change change-" + c.kind, "data-kind": c.kind, "data-start": c.start, "data-end": c.end,
          "data-before": c.tokens_before, "data-after": c.tokens_after },
          el("b", {}, messages(c) + " " + CHANGED[c.kind]),
          " (tier " + c.tier + "): " + c.tokens_before + " → " + c.tokens_after + " tokens",
          c.text ? el("code", { class: "stub" }, c.text) : null));
      }
      if (r.changes_more) items.append(el("li", { class: "status" }, "and " + r.changes_more + " more change(s)"));
      box.append(el("div", { class: "request", "data-request": r.n },
        el("div", { class: "meta" },
          el("b", {}, "request #" + r.n), " · " + time(r.at) + " · " + r.tokens_before + " → " + r.tokens_after +
          " tokens · tier " + r.tier + (r.why ? " · " + r.why : "")),
        (r.instructions || []).length ? el("ul", { class: "instructions" }, ...r.instructions.map((i) =>
          el("li", { class: "instruction", "data-source": i.source }, el("b", {}, "instructions (" + i.source + "): "), i.text))) : null,
        (r.pinned || []).length ? el("div", { class: "meta pinned", "data-pinned": r.pinned.join(",") },
          "pinned, forwarded byte for byte: " + messages({ start: r.pinned[0], end: r.pinned[0] + 1 }) +
          (r.pinned.length > 1 ? " and " + (r.pinned.length - 1) + " more (" + r.pinned.join(", ") + ")" : "")) : null,
        r.usage || r.rewritten ? el("div", { class: "meta usage" },
          usageText(r.usage) + (r.rewritten ? (r.usage ? "; " : "") + r.rewritten + " prompt tokens rewritten by compaction" : "")) : null,
        items));
    }
  }

  function drops(box, session) {
    box.replaceChildren();
    const cut = session.cut.filter((c) => c.dropped);
    if (!session.drops.length && !cut.length) {
      box.append(el("p", { class: "status" }, "No messages dropped."));
      return;
    }
    const list = el("ul");
    for (const d of session.drops) {
      list.append(el("li", { class: "drop" }, "request #" + d.request + " (" + time(d.at) + "): " + d.dropped + " message(s) not forwarded"));
    }
    if (cut.length) {
      list.append(el("li", {}, "current cut drops the units starting at messages " + cut.map((c) => c.at).join(", ")));
    }
    box.append(list);
  }

  function loadDetail(key) {
    const section = document.getElementById("detail");
    if (!key) {
      section.hidden = true;
      return Promise.resolve();
    }
    section.hidden = false;
    document.getElementById("detail-key").textContent = key;
    const meta = document.getElementById("detail-meta");
    return api("sessions/" + encodeURIComponent(key)).then(function (s) {
      meta.className = "status";
      meta.textContent = (s.model || "–") + " · " + s.requests + " request(s), the last " +
        s.recent.length + " shown · " + s.folds + " fold(s) · tiers " + s.tiers.join(" · ") +
        (s.provider_compactions ? " · " + s.provider_compactions + " provider compaction(s) served" : "") +
        " · first seen " + time(s.first_seen) + " · last seen " + time(s.last_seen);
      chart(document.getElementById("chart"), s.recent);
      blocks(document.getElementById("blocks"), s);
      changes(document.getElementById("changes"), s);
      drops(document.getElementById("drops"), s);
      document.body.setAttribute("data-loaded", key);
    }).catch(function (e) {
      meta.textContent = String(e.message || e);
      meta.className = "status error";
    });
  }

  function show() {
    const params = fragment();
    if (params.get("token")) {
      token = params.get("token");
      sessionStorage.setItem("foldgate-admin-token", token);
    }
    return Promise.all([loadList(), loadDetail(params.get("session"))]);
  }

  document.getElementById("auth").addEventListener("submit", function (event) {
    event.preventDefault();
    token = document.getElementById("token").value;
    sessionStorage.setItem("foldgate-admin-token", token);
    document.getElementById("auth").hidden = true;
    show();
  });

  document.getElementById("forget").addEventListener("click", function () {
    const key = fragment().get("session");
    if (!key || !confirm("Forget this session? Its next request folds afresh.")) return;
    api("sessions/" + encodeURIComponent(key), { method: "DELETE" }).then(function () {
      location.hash = "";
    }).catch(function (e) {
      document.getElementById("detail-meta").textContent = String(e.message || e);
    });
  });

  window.addEventListener("hashchange", show);
  show();
})();
