// The simulator page: reads the controls into a scenario, posts it to /api/simulate
// whenever a control changes, and draws the answer as hand-written SVG (small and fast
// to redraw: zooming the single-caller view needs no new run) next to the tables.
"use strict";

const SVG = "http://www.w3.org/2000/svg";
// The command line's chart colours, caller by caller.
const COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f"];
const POLICIES = [
  ["open", "fail open: admit everything"],
  ["closed", "fail closed: refuse everything (503)"],
  ["local-share", "each instance enforces its share of the quota"],
  ["static", "keeps refusing what the store last refused until that refusal expires; the rest passes"],
  ["static-then-local-share", "the store's last refusals first, then the local share for the rest"],
  ["local-share-no-divisor", "a local share not divided by the instances (a mistake)"],
  ["local-share-stale-divisor", "twice the instances run, the share still divided by the old count"],
  ["local-share-pinned", "the first caller's requests all land on one instance"],
  ["local-share-leased", "hot callers decided from leases of quota; a local share when the store is down"],
];
const NUMBER_FIELDS = ["limit", "window_secs", "instances", "store_timeout_ms", "normal_secs", "outage_secs", "recovery_secs"];
const $ = (id) => document.getElementById(id);

let answer = null;
let inFlight = null;
let timer = null;
let traceFromTouched = false;

function el(name, attrs = {}, text) {
  const node = document.createElementNS(SVG, name);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
  if (text !== undefined) node.textContent = text;
  return node;
}

function html(name, attrs = {}, text) {
  const node = document.createElement(name);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
  if (text !== undefined) node.textContent = text;
  return node;
}

function rateText(x) {
  return String(Math.round(x * 100) / 100);
}

// ---------------------------------------------------------------------------------------
// Controls

function addCaller(name, rate) {
  const body = $("callers").tBodies[0];
  const row = body.insertRow();
  const i = body.rows.length;
  const nameCell = row.insertCell();
  const nameInput = html("input", { type: "text", class: "caller-name", "aria-label": `Caller ${i} name`, value: name, maxlength: "64", autocomplete: "off" });
  nameCell.append(nameInput);
  const rateCell = row.insertCell();
  const rateInput = html("input", { type: "number", class: "caller-rate", "aria-label": `Caller ${i} requests per second`, value: String(rate), min: "0.01", step: "any", inputmode: "decimal" });
  rateCell.append(rateInput);
  const removeCell = row.insertCell();
  const remove = html("button", { type: "button", class: "remove", "aria-label": `Remove caller ${i}` }, "Remove");
  remove.addEventListener("click", () => {
    if (body.rows.length > 1) {
      row.remove();
      relabelCallers();
      scheduleRun(0);
    }
  });
  removeCell.append(remove);
}

function relabelCallers() {
  [...$("callers").tBodies[0].rows].forEach((row, k) => {
    const i = k + 1;
    row.querySelector(".caller-name").setAttribute("aria-label", `Caller ${i} name`);
    row.querySelector(".caller-rate").setAttribute("aria-label", `Caller ${i} requests per second`);
    row.querySelector(".remove").setAttribute("aria-label", `Remove caller ${i}`);
  });
}

function fill(scenario) {
  $("algorithm").value = scenario.algorithm;
  for (const field of NUMBER_FIELDS) $(field).value = scenario[field];
  $("burst").value = scenario.burst ?? "";
  $("fault").value = scenario.fault;
  for (const c of scenario.traffic) addCaller(c.name, c.rate);
  const box = $("policies");
  for (const [name, description] of POLICIES) {
    const id = `policy-${name}`;
    const wrap = html("div", { class: "check" });
    const input = html("input", { type: "checkbox", id, value: name, "aria-describedby": `${id}-hint` });
    input.checked = scenario.policies.includes(name);
    const label = html("label", { for: id }, name);
    const hint = html("small", { id: `${id}-hint` }, description);
    wrap.append(input, label, hint);
    box.append(wrap);
  }
  syncBurst();
}

function syncBurst() {
  const bucket = $("algorithm").value === "token-bucket";
  $("burst").disabled = !bucket;
}

function numberOf(id) {
  const text = $(id).value.trim();
  return text === "" ? null : Number(text);
}

function readScenario() {
  const callers = [...$("callers").tBodies[0].rows].map((row) => ({
    name: row.querySelector(".caller-name").value.trim(),
    rate: Number(row.querySelector(".caller-rate").value),
  }));
  const policies = POLICIES.map(([name]) => name).filter((name) => $(`policy-${name}`).checked);
  const scenario = {
    algorithm: $("algorithm").value,
    burst: $("algorithm").value === "token-bucket" ? numberOf("burst") : null,
    traffic: callers,
    fault: $("fault").value,
    policies,
  };
  for (const field of NUMBER_FIELDS) scenario[field] = numberOf(field);
  const names = callers.map((c) => c.name);
  const customer = names.includes($("trace-customer").value) ? $("trace-customer").value : names[0];
  const policy = policies.includes($("trace-policy").value) ? $("trace-policy").value : policies[0];
  // The stretch drawTrace shows, so that the answer covers it.
  const total = (scenario.normal_secs || 0) + (scenario.outage_secs || 0) + (scenario.recovery_secs || 0);
  const span = Number($("trace-span").value);
  const from_secs = Math.floor(Math.max(Math.min(traceFrom(scenario.normal_secs), total - span), 0));
  if (customer && policy) scenario.trace = { customer, policy, from_secs };
  return scenario;
}

// Where the single-caller view starts: where the person put it, or 2 s before the outage.
function traceFrom(normalSecs) {
  if (traceFromTouched) return Math.max(Number($("trace-from").value) || 0, 0);
  return Math.max((normalSecs || 0) - 2, 0);
}

// The control a server-side complaint is about: "traffic[1].rate", "outage_secs", ...
function controlFor(field) {
  const caller = /^traffic\[(\d+)\]\.(name|rate)$/.exec(field);
  if (caller) {
    const row = $("callers").tBodies[0].rows[Number(caller[1])];
    return row && row.querySelector(caller[2] === "name" ? ".caller-name" : ".caller-rate");
  }
  if (field.startsWith("policies")) return $("policies").querySelector("input");
  if (field.startsWith("trace")) return $("trace-customer");
  return $(field.split(/[.[]/)[0]);
}

function scheduleRun(delay = 300) {
  clearTimeout(timer);
  timer = setTimeout(run, delay);
}

async function run() {
  const scenario = readScenario();
  if (inFlight) inFlight.abort();
  const controller = new AbortController();
  inFlight = controller;
  $("status").textContent = "Running…";
  document.body.classList.add("running");
  for (const bad of document.querySelectorAll("[aria-invalid=true]")) bad.removeAttribute("aria-invalid");
  try {
    const response = await fetch("/api/simulate", {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify(scenario),
      signal: controller.signal,
    });
    const body = await response.json();
    if (controller !== inFlight) return;
    if (!response.ok) {
      const control = body.field ? controlFor(body.field) : null;
      if (control) control.setAttribute("aria-invalid", "true");
      $("error").textContent = body.field ? `${body.field}: ${body.error}` : body.error;
      $("error").hidden = false;
      $("status").textContent = "Not run: fix the highlighted control.";
      return;
    }
    $("error").hidden = true;
    answer = body;
    draw();
    const total = body.phases.reduce((sum, p) => sum + p.secs, 0);
    $("status").textContent = `Done: ${body.groups.length} ${body.groups.length === 1 ? "policy" : "policies"}, ${total} s simulated.`;
  } catch (e) {
    if (e.name === "AbortError") return;
    $("error").textContent = `The simulation could not run: ${e.message}`;
    $("error").hidden = false;
    $("status").textContent = "Failed.";
  } finally {
    if (controller === inFlight) {
      inFlight = null;
      document.body.classList.remove("running");
    }
  }
}

// ---------------------------------------------------------------------------------------
// Drawing

function draw() {
  $("summary").textContent = `${answer.summary}; ${answer.share}.`;
  drawLegend();
  drawRates();
  drawTables();
  syncTraceControls();
  drawTrace();
}

function drawLegend() {
  const legend = $("legend");
  legend.replaceChildren();
  const item = (swatchClass, color, text) => {
    const span = html("span", { class: "legend-item" });
    const swatch = html("span", { class: swatchClass, "aria-hidden": "true" });
    if (color) swatch.style.background = color;
    span.append(swatch, document.createTextNode(text));
    legend.append(span);
  };
  item("swatch outage", null, "store outage");
  answer.customers.forEach((c, i) => item("swatch line", COLORS[i % COLORS.length], `${c.name} (${rateText(c.rate)}/s sent)`));
}

function niceStep(range, ticks) {
  const raw = range / ticks;
  const power = 10 ** Math.floor(Math.log10(raw));
  for (const m of [1, 2, 5, 10]) if (raw <= m * power) return m * power;
  return 10 * power;
}

// Axes, grid labels and the outage band of one plot area.
function frame(svg, box, x0, x1, yMax, outage, yLabel) {
  const { left, top, width, height } = box;
  const sx = (x) => left + ((x - x0) / (x1 - x0)) * width;
  const sy = (y) => top + height - (y / yMax) * height;
  const band = [Math.max(outage[0], x0), Math.min(outage[1], x1)];
  if (band[1] > band[0]) {
    svg.append(el("rect", { x: sx(band[0]), y: top, width: sx(band[1]) - sx(band[0]), height, class: "outage" }));
  }
  const xStep = niceStep(x1 - x0, 8);
  for (let x = Math.ceil(x0 / xStep) * xStep; x <= x1 + 1e-9; x += xStep) {
    svg.append(el("line", { x1: sx(x), x2: sx(x), y1: top + height, y2: top + height + 4, class: "tick" }));
    svg.append(el("text", { x: sx(x), y: top + height + 16, class: "tick-label", "text-anchor": "middle" }, rateText(x)));
  }
  const yStep = niceStep(yMax, 4);
  for (let y = 0; y <= yMax + 1e-9; y += yStep) {
    svg.append(el("line", { x1: left, x2: left + width, y1: sy(y), y2: sy(y), class: "grid" }));
    svg.append(el("text", { x: left - 6, y: sy(y) + 4, class: "tick-label", "text-anchor": "end" }, rateText(y)));
  }
  svg.append(el("rect", { x: left, y: top, width, height, class: "frame" }));
  svg.append(el("text", { x: left + width / 2, y: top + height + 32, class: "axis-label", "text-anchor": "middle" }, "time (s)"));
  svg.append(el("text", { x: 12, y: top + height / 2, class: "axis-label", "text-anchor": "middle", transform: `rotate(-90 12 ${top + height / 2})` }, yLabel));
  return { sx, sy };
}

function outageSecs() {
  const start = answer.phases[0].secs;
  return [start, start + answer.phases[1].secs];
}

function drawRates() {
  const chart = $("rate-chart");
  chart.replaceChildren();
  const total = answer.phases.reduce((sum, p) => sum + p.secs, 0);
  let peak = answer.limit_per_sec;
  for (const g of answer.groups) for (const series of g.admitted_each_second) for (const v of series) peak = Math.max(peak, v);
  const yMax = peak * 1.1;
  const outage = outageSecs();
  for (const group of answer.groups) {
    // A single policy gets the whole width; several share it.
    const W = answer.groups.length === 1 ? 640 : 400, H = answer.groups.length === 1 ? 240 : 210;
    const svg = el("svg", { viewBox: `0 0 ${W} ${H}`, class: "panel", role: "img" });
    const outageRates = answer.customers.map((c, i) => {
      const series = group.admitted_each_second[i].slice(outage[0], outage[1]);
      return `${c.name} ${rateText(series.reduce((a, b) => a + b, 0) / Math.max(series.length, 1))}/s`;
    });
    svg.setAttribute("aria-label", `${group.policy}: admitted requests per second over ${total} s; during the outage ${outageRates.join(", ")}`);
    svg.append(el("text", { x: 48, y: 16, class: "panel-title" }, group.note ? `${group.policy} (${group.note})` : group.policy));
    const { sx, sy } = frame(svg, { left: 48, top: 26, width: W - 60, height: H - 70 }, 0, total, yMax, outage, "admitted/s");
    group.admitted_each_second.forEach((series, i) => {
      const points = series.map((v, s) => `${sx(s + 0.5).toFixed(1)},${sy(v).toFixed(1)}`).join(" ");
      svg.append(el("polyline", { points, class: "series", stroke: COLORS[i % COLORS.length] }));
    });
    chart.append(svg);
  }
}

function drawTables() {
  const tables = $("tables");
  tables.replaceChildren();
  answer.phases.forEach((phase) => {
    const rows = answer.rows.filter((r) => r.phase === phase.name);
    const table = html("table", { class: "phase", "data-phase": phase.name });
    table.append(html("caption", {}, `${phase.name}: ${phase.secs} s, ${phase.store}; admitted requests per second`));
    const head = table.createTHead().insertRow();
    const headers = ["policy", ...answer.customers.map((c) => `${c.name} (${rateText(c.rate)}/s)`), answer.worst_heading, "429s", "503s"];
    if (phase.name === "recovery") headers.push("all breakers closed after");
    for (const h of headers) head.append(html("th", { scope: "col" }, h));
    const body = table.createTBody();
    for (const group of answer.groups) {
      const mine = rows.filter((r) => r.policy === group.policy);
      const row = body.insertRow();
      row.append(html("th", { scope: "row" }, group.policy));
      for (const c of answer.customers) {
        const r = mine.find((m) => m.customer === c.name);
        row.append(html("td", { "data-policy": group.policy, "data-customer": c.name }, r.admitted_per_sec.toFixed(1)));
      }
      // The busiest window ending in the phase, caller by caller in the columns' order.
      const worst = answer.customers.map((c) => String(mine.find((m) => m.customer === c.name).worst_window_admitted));
      row.append(html("td", { class: "worst", "data-policy": group.policy, title: `${answer.worst_heading}: ${answer.customers.map((c) => c.name).join(" / ")}` }, worst.join(" / ")));
      row.append(html("td", {}, String(mine.reduce((s, r) => s + r.refused_429, 0))));
      row.append(html("td", {}, String(mine.reduce((s, r) => s + r.refused_503, 0))));
      if (phase.name === "recovery") {
        const ms = mine[0].all_breakers_closed_after_ms;
        row.append(html("td", {}, ms === null ? "not within the phase" : `${Math.round(ms)} ms`));
      }
    }
    tables.append(table);
  });
}

function syncTraceControls() {
  const keep = (select, values) => {
    const current = select.value;
    select.replaceChildren(...values.map((v) => html("option", { value: v }, v)));
    if (values.includes(current)) select.value = current;
  };
  keep($("trace-customer"), answer.customers.map((c) => c.name));
  keep($("trace-policy"), answer.groups.map((g) => g.policy));
  if (answer.trace) {
    $("trace-customer").value = answer.trace.customer;
    $("trace-policy").value = answer.trace.policy;
  }
  const total = answer.phases.reduce((sum, p) => sum + p.secs, 0);
  $("trace-from").max = String(Math.max(total - 1, 0));
  if (!traceFromTouched) $("trace-from").value = String(traceFrom(answer.phases[0].secs));
}

function drawTrace() {
  const chart = $("trace-chart");
  chart.replaceChildren();
  const trace = answer && answer.trace;
  if (!trace) {
    $("trace-caption").textContent = "Pick a caller and a policy.";
    return;
  }
  const total = answer.phases.reduce((sum, p) => sum + p.secs, 0);
  const span = Number($("trace-span").value);
  const from = Math.min(Math.max(Number($("trace-from").value) || 0, 0), Math.max(total - span, 0));
  const to = Math.min(from + span, total);
  // An answer traces a minute of the run: outside it, ask for the stretch shown.
  if (from * 1000 < trace.from_ms || (to * 1000 > trace.to_ms && !trace.truncated)) {
    $("trace-caption").textContent = "Loading that stretch…";
    scheduleRun(200);
    return;
  }
  const bucket = trace.algorithm === "token-bucket";
  // [sent at ms, instance, status, quota, remaining, source]
  const shown = trace.points.filter((p) => p[0] >= from * 1000 && p[0] < to * 1000);
  const state = (p) => (p[4] === null ? null : bucket ? p[4] : p[3] - p[4]);
  let yMax = 1;
  for (const p of shown) if (p[3] !== null) yMax = Math.max(yMax, p[3]);
  yMax *= 1.1;
  const W = 940, H = 300, STRIP = 36;
  const svg = el("svg", { viewBox: `0 0 ${W} ${H}`, class: "trace", role: "img" });
  const yLabel = bucket ? "tokens left" : "count in window";
  const box = { left: 76, top: 12, width: W - 92, height: H - 62 - STRIP };
  const { sx, sy } = frame(svg, { ...box }, from, to, yMax, outageSecs(), yLabel);
  // The quota in force (a local share's is smaller), then the state after each decision,
  // held until the next: a step line, broken where no counter decided.
  const steps = (value, cls) => {
    let d = "";
    let last = null;
    for (const p of shown) {
      const v = value(p);
      const x = sx(p[0] / 1000).toFixed(1);
      if (v === null) {
        last = null;
        continue;
      }
      const y = sy(v).toFixed(1);
      d += last === null ? `M${x},${y}` : `H${x}V${y}`;
      last = v;
    }
    if (d) svg.append(el("path", { d, class: cls }));
  };
  steps((p) => p[3], "quota");
  steps(state, "state");
  // Every request on a strip below: admitted, refused 429, refused 503.
  const stripY = box.top + box.height + 40;
  svg.append(el("text", { x: box.left - 6, y: stripY + 4, class: "tick-label", "text-anchor": "end" }, "requests"));
  const counts = { 200: 0, 429: 0, 503: 0, other: 0 };
  const sources = {};
  for (const p of shown) {
    const x = sx(p[0] / 1000);
    const status = p[2];
    counts[status in counts ? status : "other"] += 1;
    if (p[5]) sources[p[5]] = (sources[p[5]] || 0) + 1;
    if (status === 200) {
      svg.append(el("circle", { cx: x, cy: stripY, r: 3, class: "admitted" }));
      const v = state(p);
      if (v !== null) svg.append(el("circle", { cx: x, cy: sy(v), r: 2, class: "admitted" }));
    } else if (status === 429) {
      svg.append(el("path", { d: `M${x - 3},${stripY - 3}l6,6m0,-6l-6,6`, class: "limited" }));
    } else {
      svg.append(el("rect", { x: x - 3, y: stripY - 3, width: 6, height: 6, class: "unavailable" }));
    }
  }
  const sourceText = Object.entries(sources).map(([s, n]) => `${s.replace("_", " ")} ${n}`).join(", ");
  const caption = `${trace.customer} under ${trace.policy}, ${rateText(from)} to ${rateText(to)} s: ` +
    `${shown.length} requests${trace.truncated ? " (the first traced)" : ""}, ${counts[200]} admitted, ${counts[429]} refused 429, ${counts[503]} refused 503` +
    (sourceText ? `; decided by ${sourceText}` : "") +
    `. Line: ${yLabel} after each decision; dashed: the quota in force; dots admitted, crosses 429, squares 503.`;
  svg.setAttribute("aria-label", caption);
  chart.append(svg);
  $("trace-caption").textContent = caption;
}

// ---------------------------------------------------------------------------------------
// Start

async function start() {
  const response = await fetch("/api/scenario");
  fill(await response.json());
  $("controls").addEventListener("input", () => scheduleRun());
  $("controls").addEventListener("change", () => {
    syncBurst();
    scheduleRun();
  });
  $("add-caller").addEventListener("click", () => {
    const names = new Set([...document.querySelectorAll(".caller-name")].map((i) => i.value));
    let k = $("callers").tBodies[0].rows.length + 1;
    while (names.has(`caller${k}`)) k += 1;
    addCaller(`caller${k}`, 10);
    const rows = $("callers").tBodies[0].rows;
    rows[rows.length - 1].querySelector(".caller-name").focus();
    scheduleRun(0);
  });
  for (const id of ["trace-customer", "trace-policy"]) $(id).addEventListener("change", () => scheduleRun(0));
  $("trace-from").addEventListener("input", () => {
    traceFromTouched = true;
    drawTrace();
  });
  $("trace-span").addEventListener("change", drawTrace);
  run();
}

start().catch((e) => {
  $("status").textContent = `The page could not start: ${e.message}`;
});
