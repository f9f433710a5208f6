// The dashboard's one script: it calls this service's JSON API with the key kept in this tab's
// sessionStorage (sent as a bearer header, never in a URL or a cookie) and renders what the API
// answers. It builds the page with DOM calls and textContent only (no HTML from data), and the
// charts as inline SVG from the API's numbers. Nothing is loaded from another host.
"use strict";

const KEY = "dpss.apiKey";
const SVG = "http://www.w3.org/2000/svg";
const PAGE_LIMIT = 200;
const MAX_PAGES = 50;

class ApiError extends Error {
  constructor(status, body, retryAfter) {
    super(`${status} ${body && body.detail ? body.detail : "request failed"}`);
    this.status = status;
    this.code = body && body.error ? body.error : null;
    // A 503 (database busy or unreachable, overload) says when to come back.
    this.retryAfter = retryAfter;
  }
}

function storedKey() {
  return sessionStorage.getItem(KEY);
}

async function api(path) {
  const response = await fetch(path, {
    headers: { Authorization: `Bearer ${storedKey()}`, Accept: "application/json" },
    cache: "no-store",
    credentials: "omit",
  });
  let body = null;
  try {
    body = await response.json();
  } catch (error) {
    body = null;
  }
  if (!response.ok) throw new ApiError(response.status, body, response.headers.get("Retry-After"));
  return body;
}

// Every page of a cursor-paginated list (bounded).
async function allPages(path) {
  const items = [];
  let cursor = null;
  for (let page = 0; page < MAX_PAGES; page += 1) {
    const sep = path.includes("?") ? "&" : "?";
    const url = `${path}${sep}limit=${PAGE_LIMIT}${cursor ? `&cursor=${encodeURIComponent(cursor)}` : ""}`;
    const body = await api(url);
    items.push(...body.items);
    if (!body.next) break;
    cursor = body.next;
  }
  return items;
}

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (name === "class") node.className = value;
    else node.setAttribute(name, value === true ? "" : String(value));
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

function svg(tag, attrs, ...children) {
  const node = document.createElementNS(SVG, tag);
  for (const [name, value] of Object.entries(attrs || {})) node.setAttribute(name, String(value));
  for (const child of children.flat()) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

function fill(id, ...nodes) {
  const target = document.getElementById(id);
  if (target) target.replaceChildren(...nodes.filter((node) => node !== null && node !== undefined));
}

// What went wrong, in words: a refusal (4xx) is not an outage (503: try again later) nor a
// service that did not answer at all (fetch's TypeError).
function problem(error) {
  if (!(error instanceof ApiError)) {
    return `The service did not answer (${error.message}): it may be down or restarting; reload the page to try again.`;
  }
  // A restore held (503 restore_unaccepted) lasts until an admin accepts it: its detail says so,
  // and "try again in 60 s" would not.
  if (error.status === 503 && error.code !== "restore_unaccepted") {
    const wait = error.retryAfter ? ` Try again in ${error.retryAfter} s (reload the page).` : " Reload the page to try again.";
    return `The service is unavailable for now: ${error.message}.${wait}`;
  }
  return `The API refused: ${error.message}`;
}

function failure(error) {
  return el("p", { class: "error", role: "alert", "data-status": error instanceof ApiError ? error.status : "none" }, problem(error));
}

const humanize = (name) => name.replaceAll("_", " ");
const when = (value) => (value ? new Date(value).toISOString().replace("T", " ").slice(0, 19) + " UTC" : "–");
const short = (value) => (value ? String(value).slice(0, 8) : "–");
const num = (value) => Number.parseFloat(value);

// A budget figure for people, as api_schemas.figures.shown states them for every table: a spent
// figure or a cost rounded UP, a total or remaining figure DOWN (so a shown figure never
// overstates what is left), in plain notation ("0.0000001", never "1e-7"). Worked on the API's
// exact decimal string with BigInt: a float would round 0.58936393... to 0.589364, above it.
// The number of significant digits is the CLI's (api_schemas.figures.SIGNIFICANT), written into
// the page by the server, so the dashboard and the CLI state the same spend the same way.
const DIGITS = Number.parseInt(document.body.dataset.significant, 10);
function figure(value, up) {
  const match = /^(-?)(\d*)(?:\.(\d*))?(?:[eE]([+-]?\d+))?$/.exec(String(value).trim());
  if (!match || (match[2] === "" && !match[3])) return String(value);
  const [, sign, whole, frac = "", exp = "0"] = match;
  let mantissa = BigInt(`${whole}${frac}` || "0");
  let scale = frac.length - Number(exp); // value = mantissa / 10^scale
  if (mantissa === 0n) return "0";
  const drop = mantissa.toString().length - DIGITS;
  if (drop > 0) {
    const unit = 10n ** BigInt(drop);
    const cut = mantissa % unit !== 0n;
    mantissa /= unit; // toward zero
    // Away from zero when the rounding asked for points that way: up for a positive figure.
    if (cut && up === (sign === "")) mantissa += 1n;
    scale -= drop;
  }
  let digits = mantissa.toString();
  if (scale <= 0) return `${sign}${digits}${"0".repeat(-scale)}`;
  digits = digits.padStart(scale + 1, "0");
  const text = `${digits.slice(0, -scale)}.${digits.slice(-scale)}`.replace(/\.?0+$/, "");
  return `${sign}${text}`;
}
const down = (value) => figure(value, false);
const up = (value) => figure(value, true);

function table(columns, rows, attrs) {
  if (!rows.length) return el("p", { class: "empty" }, "None.");
  return el(
    "table",
    attrs || {},
    el("thead", {}, el("tr", {}, columns.map(([label]) => el("th", { scope: "col" }, label)))),
    el("tbody", {}, rows.map((row) => el("tr", {}, columns.map(([, cell]) => el("td", {}, cell(row)))))),
  );
}

// Every field the budget JSON has, whatever they are (new fields render without a change here).
function budgetTable(budget) {
  return el(
    "table",
    { class: "budget" },
    el("tbody", {}, Object.entries(budget).map(([name, value]) =>
      el("tr", { "data-field": name }, el("th", { scope: "row" }, humanize(name)),
        el("td", {}, value === null ? "—" : typeof value === "object" ? JSON.stringify(value) : figure(value, /_spent$/.test(name)))))),
  );
}

function budgetBar(budget) {
  const total = num(budget.epsilon_total);
  const spent = num(budget.epsilon_spent);
  const share = total > 0 ? Math.min(1, spent / total) : 0;
  const width = 320;
  return svg(
    "svg",
    { class: "bar", width, height: 22, viewBox: `0 0 ${width} 22`, role: "img",
      "aria-label": `epsilon spent ${up(budget.epsilon_spent)} of ${down(budget.epsilon_total)}`, "data-spent": spent, "data-total": total },
    svg("rect", { x: 0, y: 2, width, height: 18, class: "bar-total" }),
    svg("rect", { x: 0, y: 2, width: share * width, height: 18, class: "bar-spent" }),
    svg("title", {}, `epsilon spent ${up(budget.epsilon_spent)} of ${down(budget.epsilon_total)}`),
  );
}

// Epsilon spent over time from the ledger: each entry's epsilon_after (the dataset's net spend
// after it, stated as the budget states epsilon_spent, at its delta_total, for every accounting).
function spendingChart(entries, total) {
  const width = 560;
  const height = 200;
  const pad = { left: 48, right: 12, top: 12, bottom: 28 };
  let running = 0;
  const points = entries.map((entry) => {
    running = num(entry.epsilon_after);
    return { t: new Date(entry.created_at).getTime(), y: running, spent: entry.epsilon_after };
  });
  const chart = svg("svg", {
    class: "chart spending", width, height, viewBox: `0 0 ${width} ${height}`, role: "img",
    "aria-label": "epsilon spent over time", "data-final": running, "data-points": points.length,
  });
  const top = Math.max(total, running, 1e-12);
  const t0 = points.length ? points[0].t : 0;
  const t1 = points.length ? points[points.length - 1].t : 1;
  const span = Math.max(t1 - t0, 1);
  const x = (t) => pad.left + ((t - t0) / span) * (width - pad.left - pad.right);
  const y = (v) => height - pad.bottom - (v / top) * (height - pad.top - pad.bottom);
  chart.append(
    svg("line", { x1: pad.left, y1: y(0), x2: width - pad.right, y2: y(0), class: "axis" }),
    svg("line", { x1: pad.left, y1: y(0), x2: pad.left, y2: pad.top, class: "axis" }),
    svg("line", { x1: pad.left, y1: y(total), x2: width - pad.right, y2: y(total), class: "limit" }),
    svg("text", { x: pad.left - 6, y: y(total) + 4, class: "tick", "text-anchor": "end" }, down(total)),
    svg("text", { x: pad.left - 6, y: y(0) + 4, class: "tick", "text-anchor": "end" }, "0"),
  );
  if (!points.length) {
    chart.append(svg("text", { x: width / 2, y: height / 2, class: "tick", "text-anchor": "middle" }, "nothing spent yet"));
    return chart;
  }
  let path = `M ${x(t0)} ${y(0)}`;
  let previous = 0;
  for (const point of points) {
    path += ` L ${x(point.t)} ${y(previous)} L ${x(point.t)} ${y(point.y)}`;
    previous = point.y;
  }
  path += ` L ${width - pad.right} ${y(previous)}`;
  chart.append(svg("path", { d: path, class: "line" }));
  for (const point of points) {
    chart.append(svg("circle", { cx: x(point.t), cy: y(point.y), r: 3, class: "point", "data-epsilon": point.y },
      svg("title", {}, `${when(new Date(point.t).toISOString())}: ${up(point.spent)}`)));
  }
  chart.append(
    svg("text", { x: pad.left, y: height - 8, class: "tick" }, when(new Date(t0).toISOString())),
    svg("text", { x: width - pad.right, y: height - 8, class: "tick", "text-anchor": "end" }, when(new Date(t1).toISOString())),
  );
  return chart;
}

// Net epsilon by grant (and spent without one), from the same ledger entries: horizontal bars.
// Each entry counts its epsilon_increment (under gaussian and zcdp epsilons do not add up: the
// bars share the dataset's epsilon_spent out in the order it was spent).
function byGrantChart(entries, grants) {
  const labels = new Map(grants.map((g) => [g.id, `grant ${short(g.id)} (${analystName(g)})`]));
  const sums = new Map();
  for (const entry of entries) {
    const id = entry.grant_id || "";
    sums.set(id, (sums.get(id) || 0) + num(entry.epsilon_increment));
  }
  const rows = [...sums.entries()];
  const width = 560;
  const rowHeight = 24;
  const height = Math.max(1, rows.length) * rowHeight + 8;
  const chart = svg("svg", { class: "chart by-grant", width, height, viewBox: `0 0 ${width} ${height}`, role: "img", "aria-label": "epsilon spent by grant" });
  const top = Math.max(1e-12, ...rows.map(([, v]) => v));
  rows.forEach(([id, value], index) => {
    const label = id ? labels.get(id) || `grant ${short(id)}` : "no grant (dataset budget)";
    const barWidth = (Math.max(0, value) / top) * 220;
    chart.append(
      svg("text", { x: 0, y: index * rowHeight + 17, class: "tick" }, label),
      svg("rect", { x: 300, y: index * rowHeight + 4, width: barWidth, height: 16, class: "bar-spent", "data-grant": id || "none", "data-epsilon": value }),
      svg("text", { x: 306 + barWidth, y: index * rowHeight + 17, class: "tick" }, up(value)),
    );
  });
  if (!rows.length) chart.append(svg("text", { x: 0, y: 17, class: "tick" }, "nothing spent yet"));
  return chart;
}

const releaseColumns = [
  ["created", (r) => when(r.created_at)],
  ["release", (r) => short(r.id)],
  ["mechanism", (r) => r.mechanism],
  ["k", (r) => r.k],
  ["epsilon", (r) => up(r.epsilon)],
  ["delta", (r) => up(r.delta)],
  ["status", (r) => el("span", { class: `status ${r.status}` }, r.status)],
  ["reason", (r) => r.reason || ""],
  ["result notes", (r) => resultNotes(r)],
];

// What the service says about a result beside the result itself: the share of variance the
// components keep and its 90% interval, or that the noise hides it (then the ratio is a guess and
// is not shown), and the release's warning (e.g. directions indistinguishable from random). The
// page offered a basis to download without either.
function resultNotes(r) {
  const extras = (r.result && r.result.extras) || {};
  const notes = [];
  const interval = extras.explained_variance_ratio_interval;
  const span = Array.isArray(interval) ? ` (90% interval [${interval.map((v) => num(v).toFixed(2)).join(", ")}])` : "";
  if (extras.explained_variance_hidden_by_noise === true) {
    notes.push(el("span", { class: "variance hidden-by-noise" }, `explained variance hidden by noise${span}`));
  } else if (extras.explained_variance_split_hidden_by_noise === true) {
    // k = d: all of the variance is kept (a public fact), but its split among the components is
    // not measured (the service states none).
    notes.push(el("span", { class: "variance split-hidden-by-noise" }, `explained variance 1.00${span}, its split among the components hidden by noise`));
  } else if (Array.isArray(extras.explained_variance_ratio)) {
    const kept = extras.explained_variance_ratio.reduce((a, v) => a + num(v), 0);
    notes.push(el("span", { class: "variance" }, `explained variance ${kept.toFixed(2)}${span}`));
  }
  if (extras.warning) {
    notes.push(el("span", { class: "warning", "data-code": extras.warning_code || "" }, `Warning: ${extras.warning}`));
  }
  return notes.length ? el("div", { class: "notes" }, notes) : "";
}

// An analyst key by its name, with its id's start to tell two keys of one name apart.
function analystName(g) {
  return g.analyst_key_id ? `${g.analyst_key_name || "analyst"} · ${short(g.analyst_key_id)}` : "all analysts";
}

// The native figure beside the epsilon one (never instead of it): mu on gaussian, rho on zcdp,
// both on hybrid (its Gaussian-DP filter's mu and its zCDP filter's rho: either may admit the
// next release, and mu alone read 0 once an approximate step closed that filter while rho was left).
function nativeRemaining(b) {
  const has = (value) => value !== null && value !== undefined;
  if (b.accounting === "hybrid" && has(b.mu_remaining) && has(b.rho_remaining)) {
    return `mu ${down(b.mu_remaining)}, rho ${down(b.rho_remaining)}`;
  }
  if (has(b.mu_remaining)) return `mu ${down(b.mu_remaining)}`;
  if (has(b.rho_remaining)) return `rho ${down(b.rho_remaining)}`;
  return "—";
}

// Under hybrid epsilon_remaining is what the next Gaussian release at the budget's delta is
// admitted at, not what every kind of release may still ask for (its filters charge pure and
// approximate releases differently from Gaussian ones): the
// API's descriptions and refusals say so, and the page showed the bare figure. Said once beside
// every table that shows a hybrid budget or grant.
// A pure release (delta 0) has a figure of its own, epsilon_remaining_pure (the budgets, grants,
// dry runs and refusals state it): the note names it, with its value when the note is about one
// budget, and the tables show it in their "pure epsilon remaining" column.
function hybridNote(budgets) {
  const hybrid = budgets.filter((b) => b && b.accounting === "hybrid");
  if (!hybrid.length) return null;
  const pure = hybrid.length === 1 && hybrid[0].epsilon_remaining_pure != null
    ? `: ${down(hybrid[0].epsilon_remaining_pure)} now` : " (the pure epsilon remaining column)";
  return el("p", { class: "meta hybrid-remaining" },
    "hybrid: epsilon remaining is what the next Gaussian release (at the budget's delta) is admitted at, ",
    "not what every kind of release may still ask for ",
    "(a pure or approximate release may be refused below it). A pure release (delta 0) is admitted at up to ",
    `epsilon_remaining_pure${pure}. A dry run (dry_run=true) and a refusal give `,
    "epsilon_admissible, the largest epsilon that request is admitted at now. See ",
    el("a", { href: "/dashboard/reading-a-budget" }, "Reading a budget"), ".");
}

// What a pure release (delta 0) is admitted at: shown where it is not epsilon remaining itself
// (hybrid, zcdp); basic's is epsilon remaining, and gaussian admits no pure release.
function pureRemaining(b) {
  const shown = (b.accounting === "hybrid" || b.accounting === "zcdp") && b.epsilon_remaining_pure != null;
  return shown ? down(b.epsilon_remaining_pure) : "—";
}

// A dataset by its name, with its id's start to tell two datasets of one name apart.
function datasetName(d) {
  return `${d.name} · ${short(d.id)}`;
}

const grantColumns = [
  ["grant", (g) => short(g.id)],
  ["analyst", (g) => analystName(g)],
  ["epsilon total", (g) => down(g.epsilon_total)],
  ["epsilon spent", (g) => up(g.epsilon_spent)],
  ["epsilon remaining", (g) => down(g.epsilon_remaining)],
  ["delta remaining", (g) => down(g.delta_remaining)],
  ["native remaining", (g) => nativeRemaining(g)],
  ["pure epsilon remaining", (g) => pureRemaining(g)],
  ["revoked", (g) => (g.revoked_at ? when(g.revoked_at) : "")],
];

// What the budget protects (issue 34): a person named by the upload's privacy_unit_column, or a
// row, in which case a person with r rows is protected only at up to r times epsilon.
function privacyUnit(dataset) {
  if (dataset.privacy_unit === "person") {
    return `Privacy unit: person (${dataset.n_units} people): every release bounds a person's total contribution.`;
  }
  return "Privacy unit: row. A person with several rows is protected only at up to that many times epsilon; name a privacy_unit_column at upload to protect people.";
}

async function ownerView() {
  const datasets = await allPages("/v1/datasets");
  if (!datasets.length) return fill("datasets", el("p", { class: "empty" }, "You have no datasets."));
  const cards = await Promise.all(datasets.map(async (dataset) => {
    const base = `/v1/datasets/${dataset.id}`;
    const [budget, ledger, grants, releases] = await Promise.all([
      api(`${base}/budget`), allPages(`${base}/ledger`), api(`${base}/grants`), api(`${base}/releases?limit=50`),
    ]);
    return el("section", { class: "card dataset", "data-dataset": dataset.id },
      el("h2", {}, datasetName(dataset)),
      el("p", { class: "meta" }, `${dataset.n_rows} rows × ${dataset.n_cols} columns · ${dataset.n_batches} batch(es) · created ${when(dataset.created_at)} · id ${dataset.id}`),
      el("p", { class: "meta privacy-unit" }, privacyUnit(dataset)),
      el("div", { class: "row" },
        el("div", {}, el("h3", {}, "Budget"), budgetTable(budget), budgetBar(budget), hybridNote([budget])),
        el("div", {}, el("h3", {}, "Epsilon spent over time"), spendingChart(ledger, num(budget.epsilon_total)))),
      el("h3", {}, "Epsilon spent by grant"), byGrantChart(ledger, grants.items),
      el("h3", {}, `Grants (${grants.total})`), table(grantColumns, grants.items, { class: "grants" }),
      el("h3", {}, `Releases (${releases.total})`), table(releaseColumns, releases.items, { class: "releases" }));
  }));
  fill("datasets", ...cards);
}

function download(name, text) {
  const url = URL.createObjectURL(new Blob([text], { type: "text/csv" }));
  const link = el("a", { href: url, download: name });
  document.body.append(link);
  link.click();
  link.remove();
  setTimeout(() => URL.revokeObjectURL(url), 1000);
}

async function downloadBasis(release) {
  const full = await api(`/v1/releases/${release.id}`);
  const basis = (full.result && full.result.basis) || [];
  download(`release-${release.id}-basis.csv`, basis.map((row) => row.join(",")).join("\n") + "\n");
}

async function analystView() {
  const [grants, datasets, releases] = await Promise.all([
    api("/v1/grants").catch(failure), allPages("/v1/datasets").catch(failure), api("/v1/releases?limit=50").catch(failure),
  ]);
  const names = new Map(Array.isArray(datasets) ? datasets.map((d) => [d.id, datasetName(d)]) : []);
  fill("grants", ...(grants instanceof Node ? [grants] : [table([["dataset", (g) => names.get(g.dataset_id) || short(g.dataset_id)], ...grantColumns], grants.items, { class: "grants" }), hybridNote(grants.items)]));
  fill("budgets", datasets instanceof Node ? datasets : table([
    ["dataset", (d) => datasetName(d)],
    ["epsilon remaining", (d) => down(d.budget.epsilon_remaining)],
    ["delta remaining", (d) => down(d.budget.delta_remaining)],
    ["native remaining", (d) => nativeRemaining(d.budget)],
    ["pure epsilon remaining", (d) => pureRemaining(d.budget)],
    ["spent", (d) => budgetBar(d.budget)],
  ], datasets, { class: "budgets" }), ...(datasets instanceof Node ? [] : [hybridNote(datasets.map((d) => d.budget))]));
  fill("releases", releases instanceof Node ? releases : table([
    ...releaseColumns,
    ["dataset", (r) => names.get(r.dataset_id) || short(r.dataset_id)],
    ["visible at", (r) => when(r.visible_at)],
    ["basis", (r) => (r.status === "succeeded" && r.result && r.result.basis_sha256
      ? el("button", { type: "button", class: "download", "data-release": r.id }, "Download CSV")
      : "")],
  ], releases.items, { class: "releases" }));
  for (const button of document.querySelectorAll("button.download")) {
    const release = releases.items.find((r) => r.id === button.dataset.release);
    button.addEventListener("click", () => downloadBasis(release).catch((e) => button.after(failure(e))));
  }
}

async function auditorView() {
  const verification = api("/v1/audit/verification").then((v) => {
    const banner = el("p", { class: `verdict ${v.ok ? "ok" : "broken"}`, "data-ok": String(v.ok) },
      v.ok ? `Chain verified: ${v.checked} events, no problem found.` : `Chain BROKEN: ${v.problems.length} problem(s) in ${v.checked} events.`);
    const anchor = v.anchor
      ? el("p", { class: `anchor ${v.anchor_found ? "ok" : "broken"}` }, `Anchored head ${v.anchor}: ${v.anchor_found ? "found in the chain" : "NOT found in the chain"}.`)
      : el("p", { class: "anchor" }, "No anchored head configured (DPSS_AUDIT_ANCHOR).");
    const restore = v.restore_unaccepted
      ? el("p", { class: "verdict broken restore", "data-restore": "unaccepted" },
        "Restore detected and not accepted: the API refuses charges and key use until an admin runs `dpss audit accept-restore`. ", el("code", {}, v.restore_unaccepted))
      : null;
    return [restore, banner,
      el("p", {}, "Head: ", el("code", { class: "head" }, v.head)), anchor,
      el("p", { class: "meta" }, `Checked ${when(v.verified_at)}; event MACs ${v.macs_checked ? "checked" : "not checked (no DPSS_AUDIT_HMAC_KEY)"}.`),
      v.problems.length ? el("ul", { class: "problems" }, v.problems.map((p) => el("li", {}, p))) : null,
      v.notes.length ? el("ul", { class: "notes" }, v.notes.map((n) => el("li", {}, n))) : null];
  }).catch((e) => [failure(e)]);
  const log = api("/v1/audit?limit=1").then(async (first) => {
    const after = Math.max(0, first.total - 100);
    const page = await api(`/v1/audit?after=${after}&limit=100`);
    return [el("p", { class: "meta" }, `${first.total} events; the newest ${page.items.length} shown.`),
      table([
        ["seq", (e) => e.seq],
        ["time", (e) => when(e.created_at)],
        ["event", (e) => e.event_type],
        ["actor key", (e) => short(e.actor_key_id)],
        ["dataset", (e) => short(e.dataset_id)],
        ["release", (e) => short(e.release_id)],
        ["details", (e) => {
          // The whole JSON on hover; the table shows its start.
          const text = JSON.stringify(e.details);
          return el("code", { title: text }, text.length > 90 ? `${text.slice(0, 90)}…` : text);
        }],
        ["hash", (e) => el("code", { title: e.hash }, e.hash.slice(0, 12))],
      ], page.items.slice().reverse(), { class: "audit" })];
  }).catch((e) => [failure(e)]);
  const [verdict, events] = await Promise.all([verification, log]);
  fill("verification", ...verdict);
  fill("audit", ...events);
}

async function adminView() {
  const [queue, workers, keys] = await Promise.all([
    api("/v1/queue").catch(failure), api("/v1/workers").catch(failure), allPages("/v1/keys").catch(failure),
  ]);
  fill("queue", ...(queue instanceof Node ? [queue] : [
    el("p", { class: "counts", "data-queued": queue.queued, "data-running": queue.running },
      `${queue.queued} queued, ${queue.running} running; oldest wait ${queue.oldest_queued_age_seconds === null ? "–" : `${queue.oldest_queued_age_seconds.toFixed(1)} s`}.`),
    el("p", { class: "late", "data-late": Object.values(queue.late || {}).reduce((a, b) => a + b, 0) },
      Object.keys(queue.late || {}).length
        ? `Late releases (ended after visible_at; shown at the next step of their schedule): ${Object.entries(queue.late).map(([m, c]) => `${m} ${c}`).join(", ")}.`
        : "Late releases: none."),
    table([
      ["release", (j) => short(j.release_id)], ["mechanism", (j) => j.mechanism], ["k", (j) => j.k],
      ["status", (j) => j.status], ["attempts", (j) => j.attempts], ["requested", (j) => when(j.created_at)],
      ["worker", (j) => j.lease_owner || ""], ["lease until", (j) => when(j.lease_expires_at)],
    ], queue.items, { class: "queue" })]));
  fill("workers", ...(workers instanceof Node ? [workers] : [
    el("p", { class: "counts", "data-alive": workers.alive }, `${workers.alive} alive of ${workers.total} seen in the last day.`),
    table([
      ["worker", (w) => w.worker_id], ["alive", (w) => (w.alive ? "yes" : "no")],
      ["started", (w) => when(w.started_at)], ["last heartbeat", (w) => when(w.last_seen_at)],
      ["running", (w) => short(w.running_release_id)],
    ], workers.items, { class: "workers" })]));
  fill("keys", keys instanceof Node ? keys : table([
    ["key", (k) => short(k.id)], ["role", (k) => k.role], ["name", (k) => k.name],
    ["created", (k) => when(k.created_at)], ["revoked", (k) => (k.revoked_at ? when(k.revoked_at) : "")],
  ], keys, { class: "keys" }));
}

const VIEWS = { owner: ownerView, analyst: analystView, auditor: auditorView, admin: adminView };

function signOut() {
  sessionStorage.removeItem(KEY);
  window.location.assign("/dashboard");
}

async function signIn(event) {
  event.preventDefault();
  const input = document.getElementById("api-key");
  const error = document.getElementById("sign-in-error");
  sessionStorage.setItem(KEY, input.value.trim());
  input.value = "";
  try {
    const me = await api("/v1/whoami");
    window.location.assign(`/dashboard/${me.role}`);
  } catch (failed) {
    sessionStorage.removeItem(KEY);
    error.textContent = failed instanceof ApiError && failed.status === 401 ? "That key is not valid (or was revoked)." : `Sign-in failed: ${failed.message}`;
    error.hidden = false;
  }
}

async function start() {
  const view = document.body.dataset.view;
  // The explanation of rho and mu is text only: no key, no API call.
  if (view === "reading-a-budget") {
    document.body.dataset.ready = "true";
    return;
  }
  const form = document.getElementById("sign-in");
  if (form) form.addEventListener("submit", signIn);
  document.getElementById("sign-out").addEventListener("click", signOut);
  if (!storedKey()) {
    if (view !== "signin") window.location.replace("/dashboard");
    return;
  }
  let me;
  try {
    me = await api("/v1/whoami");
  } catch (error) {
    // Only a key the service refuses (401: not valid, or revoked) is forgotten. An outage (503,
    // or no answer) signed the visitor out with no word; now the key stays and the page says
    // what happened.
    if (error instanceof ApiError && error.status === 401) {
      sessionStorage.removeItem(KEY);
      if (view !== "signin") window.location.replace("/dashboard");
      return;
    }
    const notice = document.getElementById("notice");
    notice.textContent = problem(error);
    notice.setAttribute("role", "alert");
    notice.dataset.status = error instanceof ApiError ? String(error.status) : "none";
    notice.hidden = false;
    for (const loading of document.querySelectorAll(".loading")) loading.remove();
    document.body.dataset.ready = "true";
    return;
  }
  if (view === "signin") {
    window.location.replace(`/dashboard/${me.role}`);
    return;
  }
  document.getElementById("who-name").textContent = `${me.name} (${me.role})`;
  document.getElementById("who").hidden = false;
  const notices = [];
  if (me.restore_unaccepted) {
    notices.push(`Restore detected and not accepted: the API refuses charges and key use until an admin runs \`dpss audit accept-restore\`. ${me.restore_unaccepted}`);
  }
  if (me.role !== view) {
    notices.push(`This view is for ${view} keys; yours is an ${me.role} key. What follows is what the API lets your key read here.`);
  }
  if (notices.length) {
    const notice = document.getElementById("notice");
    notice.textContent = notices.join(" ");
    notice.hidden = false;
    if (me.restore_unaccepted) notice.dataset.restore = "unaccepted";
  }
  try {
    await VIEWS[view]();
  } catch (error) {
    for (const id of ["datasets", "grants", "budgets", "releases", "verification", "audit", "queue", "workers", "keys"]) {
      const target = document.getElementById(id);
      if (target && target.querySelector(".loading")) target.replaceChildren(failure(error));
    }
  }
  document.body.dataset.ready = "true";
}

document.addEventListener("DOMContentLoaded", start);
