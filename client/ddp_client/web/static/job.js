// A job's page: its status, curves (uPlot) with each attempt marked, ranks, logs, Events and files.
"use strict";

const query = new URLSearchParams(location.search);
const job = jobQuery(query.get("namespace"), query.get("name"), query.get("results"));
const charts = {};  // metric -> uPlot
let marks = [];
let logEnd = null;  // null: follow the log's end; a number: the older page shown ends there
let knownRanks = new Set();
let shownRanks = "";  // the ranks as last drawn (JSON)
let shownEvents = "";
const COLORS = ["#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2", "#be185d", "#4d7c0f",
                "#1e3a8a", "#7f1d1d", "#14532d", "#581c87", "#7c2d12", "#164e63", "#831843", "#365314"];
let lastSteps = {};  // rank -> {step, time} of its newest record
const EVENTS_SHOWN = 200;  // the newest; a gang of a thousand pods has thousands

document.getElementById("title").textContent = `${query.get("namespace")}/${query.get("name")}`;
document.title = `${query.get("name")} - DDPJob`;

function summaryHtml(page) {
  const row = page.job, status = page.status || {};
  const parts = [`<span class="phase phase-${esc(row.phase)}" id="phase">${esc(row.phase)}</span>`];
  if (!page.deleted) {
    parts.push(`<span>ready <b id="ready">${esc(row.ready)}</b></span>`, `<span>${esc(row.world)}</span>`,
               `<span>restarts <b id="restarts">${esc(row.restarts)}</b></span>`, `<span>attempt ${esc(status.attempt)}</span>`,
               `<span>${progressCell(row)}</span>`);
    if (row.samplesPerSecond) parts.push(`<span>${esc(Math.round(row.samplesPerSecond))} samples/s</span>`);
    if (status.lastCheckpoint) parts.push(`<span>checkpoint step ${esc(status.lastCheckpoint.step)} <span class="muted">${esc(status.lastCheckpoint.uri)}</span></span>`);
    if (status.checkpointsBehind) parts.push(`<span class="failure" id="checkpoints-behind">checkpoint ${esc(status.checkpointsBehind)}</span>`);
    if (status.kept) parts.push(`<span>kept: ${esc(status.kept)}</span>`);
    if (status.recovery) parts.push(`<span id="recovery">${esc(status.recovery)}</span>`);
    if (status.snapshots) parts.push(`<span class="muted" id="snapshots">snapshots ${esc(status.snapshots)}</span>`);
  } else {
    parts.push(`<span class="muted">the DDPJob is gone; ${esc(row.message)}</span>`);
  }
  if (row.reason || row.message) parts.push(`<div id="reason"><b>${esc(row.reason)}</b> ${esc(page.deleted ? "" : row.message)}</div>`);
  return parts.join("");
}

function rankHtml(rank) {
  const ended = rank.ended ? `exit ${esc(rank.ended.exitCode)} ${esc(rank.ended.reason)}` : "";
  const words = rank.failure ? `<div class="failure"><b>${esc(rank.failure.reason)}</b> (${esc(rank.failure.kind || "")} failure, attempt ${esc(rank.failure.attempt)})<pre class="words">${esc(rank.failure.lastWords)}</pre></div>` : "";
  const place = rank.rank === null ? `<span class="muted">waiting</span>` : esc(rank.rank);
  return `<tr data-rank="${esc(rank.rank ?? "")}"><td>${place}</td><td>${esc(rank.pod)}</td><td>${esc(rank.attempt)}</td>
    <td>${esc(rank.node)}</td><td class="state">${esc(rank.state)}</td><td>${rank.ready ? "yes" : ""}</td>
    <td class="last-step"></td><td class="held">${esc(rank.held)} ${ended}${words}</td></tr>`;
}

async function loadJob() {
  const page = await getJson(`/api/job?${job}`, document.getElementById("error")).catch(() => null);
  if (!page) return;
  document.getElementById("summary").innerHTML = summaryHtml(page);
  const why = page.failure || page.lastRestart || "";
  const box = document.getElementById("failure-box");
  box.hidden = !why;
  document.getElementById("failure-title").textContent = page.failure ? "Failure" : "Cause of the last restart";
  document.getElementById("failure").textContent = why;
  // Rows are made again only where the ranks changed: a job of a thousand ranks is read every 2 s.
  const ranksSeen = JSON.stringify(page.ranks || []);
  if (ranksSeen !== shownRanks) {
    shownRanks = ranksSeen;
    document.querySelector("#ranks tbody").innerHTML = (page.ranks || []).map(rankHtml).join("")
      || `<tr><td colspan="8" class="muted">${page.deleted ? "the job is gone" : "no pods"}</td></tr>`;
    showLastSteps();
  }
  const workers = page.dataWorkers || [];
  document.getElementById("workers-box").hidden = workers.length === 0;
  document.querySelector("#workers tbody").innerHTML = workers.map(w =>
    `<tr><td>${esc(w.pod)}</td><td>${esc(w.node)}</td><td>${esc(w.state)}</td><td>${esc(w.held)}</td></tr>`).join("");
  const eventsSeen = JSON.stringify(page.events || []);
  if (eventsSeen !== shownEvents) {
    shownEvents = eventsSeen;
    const events = (page.events || []).slice().reverse();
    const older = events.length > EVENTS_SHOWN ? `<tr><td colspan="5" class="muted">${events.length - EVENTS_SHOWN} older not shown</td></tr>` : "";
    document.querySelector("#events tbody").innerHTML = events.slice(0, EVENTS_SHOWN).map(e =>
      `<tr class="event-${esc(e.type)}"><td>${esc(e.time)}</td><td>${esc(e.type)}</td><td>${esc(e.reason)}</td><td>${esc(e.object)}</td><td>${esc(e.message)}</td></tr>`).join("") + older;
  }
  const ranks = new Set((page.ranks || []).filter(r => r.rank !== null).map(r => r.rank));
  addRankOptions(ranks);
  const attempts = page.attempts || [];
  if (attempts.length) setAttempts(attempts);
}

function addRankOptions(ranks) {
  const select = document.getElementById("rank");
  for (const rank of [...ranks].sort((a, b) => a - b)) {
    if (rank === 0 || knownRanks.has(rank)) continue;
    knownRanks.add(rank);
    select.add(new Option(`rank ${rank}`, String(rank)));
  }
}

// Each rank's newest logged step, and how long ago; a rank well behind the leading one is marked.
function showLastSteps() {
  const steps = Object.values(lastSteps);
  if (!steps.length) return;
  const lead = Math.max(...steps.map(s => s.step)), newest = Math.max(...steps.map(s => s.time));
  for (const row of document.querySelectorAll("#ranks tbody tr[data-rank]")) {
    const last = lastSteps[row.dataset.rank], cell = row.querySelector(".last-step");
    if (!last || !cell) continue;
    cell.textContent = `step ${last.step} (${Math.max(0, Math.round(Date.now() / 1000 - last.time))}s ago)`;
    row.classList.toggle("behind", lead - last.step > Math.max(10, lead * 0.01) || newest - last.time > 60);
  }
}

function marksPlugin(axis) {
  return {hooks: {draw: [u => {
    const ctx = u.ctx;
    ctx.save();
    ctx.strokeStyle = "#d97706";
    ctx.fillStyle = "#d97706";
    ctx.lineWidth = 1.5 * devicePixelRatio;
    ctx.setLineDash([6, 4]);
    ctx.font = `${11 * devicePixelRatio}px sans-serif`;
    for (const mark of marks) {
      const x = Math.round(u.valToPos(axis === "time" ? mark.time : mark.step, "x", true));
      if (x < u.bbox.left || x > u.bbox.left + u.bbox.width) continue;
      ctx.beginPath();
      ctx.moveTo(x, u.bbox.top);
      ctx.lineTo(x, u.bbox.top + u.bbox.height);
      ctx.stroke();
      ctx.fillText(`attempt ${mark.attempt}`, x + 4, u.bbox.top + 12 * devicePixelRatio);
    }
    ctx.restore();
  }]}};
}

async function loadMetrics() {
  const rank = document.getElementById("rank").value;
  const axis = rank === "each" ? "step" : document.getElementById("axis").value;  // ranks side by side share steps
  let body;
  try {
    body = await getJson(`/api/metrics?${job}&rank=${rank}&axis=${axis}`);
    document.getElementById("metrics-error").textContent = "";
  } catch (error) {
    document.getElementById("metrics-error").textContent = String(error.message);
    return;
  }
  marks = body.marks;
  lastSteps = body.lastSteps || {};
  showLastSteps();
  addRankOptions(new Set(body.ranks));
  document.getElementById("marks").innerHTML = marks.map(m =>
    `<li data-attempt="${esc(m.attempt)}">attempt ${esc(m.attempt)} from step ${esc(m.step)}: ${esc(m.why || "restarted")}${m.resumed ? `; <span class="resumed">${esc(m.resumed)}</span>` : ""}</li>`).join("");
  const holder = document.getElementById("curves");
  for (const [name, curve] of Object.entries(body.curves)) {
    // One line, or one a rank (rank "each"): the ranks' values share the steps.
    const lines = curve.ys ? Object.keys(curve.ys) : [null];
    const data = [curve.x, ...(curve.ys ? lines.map(r => curve.ys[r]) : [curve.y])];
    const shape = `${axis}:${lines.join(",")}`;
    let chart = charts[name];
    if (!chart || chart.shape !== shape) {
      if (chart) {  // its box first: destroy() takes the chart out of it
        const box = chart.root.parentElement;
        chart.destroy();
        box.remove();
      }
      const box = document.createElement("div");
      box.className = "curve";
      holder.appendChild(box);
      const series = lines.map((r, i) => ({label: r === null ? name : `rank ${r}`, stroke: COLORS[i % COLORS.length], width: 1.5, spanGaps: true}));
      chart = new uPlot({width: Math.max(420, Math.floor(holder.clientWidth / 2) - 12), height: 220, title: name,
                         scales: {x: {time: axis === "time"}}, series: [{label: axis}, ...series],
                         plugins: [marksPlugin(axis)]}, data, box);
      chart.shape = shape;
      charts[name] = chart;
    } else {
      chart.setData(data);
    }
    chart.root.parentElement.dataset.metric = name;
    chart.root.parentElement.dataset.points = String(curve.x.length);
    chart.root.parentElement.dataset.logged = String(curve.points);
  }
}

function setAttempts(attempts) {
  const select = document.getElementById("log-attempt");
  const have = new Set([...select.options].map(o => o.value));
  for (const attempt of attempts) if (!have.has(String(attempt))) select.add(new Option(`attempt ${attempt}`, String(attempt)));
}

async function loadLog() {
  const rank = document.getElementById("log-rank").value || "0", attempt = document.getElementById("log-attempt").value;
  const end = logEnd === null ? "" : `&end=${logEnd}`;
  const body = await getJson(`/api/logs?${job}&rank=${rank}&attempt=${attempt}${end}`).catch(error => ({error: error.message}));
  const pre = document.getElementById("log");
  if (body.error) { document.getElementById("log-where").textContent = body.error; return; }
  setAttempts(body.attempts);
  const following = logEnd === null && pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 4;
  pre.textContent = body.text;
  pre.dataset.start = body.start;
  document.getElementById("log-where").textContent = `attempt ${body.attempt ?? "-"}, bytes ${body.start}-${body.end} of ${body.total}`;
  document.getElementById("log-older").disabled = body.start === 0;
  if (following) pre.scrollTop = pre.scrollHeight;
}

async function loadFiles() {
  const body = await getJson(`/api/files?${job}`, document.getElementById("files-error")).catch(() => null);
  if (!body) return;
  document.querySelector("#files tbody").innerHTML = body.files.map(f =>
    `<tr><td><a href="/api/download?${esc(job)}&path=${esc(encodeURIComponent(f.path))}">${esc(f.path)}</a></td><td>${esc(f.size)}</td></tr>`).join("");
}

document.getElementById("rank").onchange = loadMetrics;
document.getElementById("axis").onchange = loadMetrics;
document.getElementById("log-rank").onchange = () => { logEnd = null; loadLog(); };
document.getElementById("log-attempt").onchange = () => { logEnd = null; loadLog(); };
document.getElementById("log-older").onclick = () => { logEnd = Number(document.getElementById("log").dataset.start); loadLog(); };

loadJob(); loadMetrics(); loadLog(); loadFiles();
setInterval(loadJob, 2000);
setInterval(loadMetrics, 5000);
setInterval(() => { if (logEnd === null) loadLog(); }, 3000);
setInterval(loadFiles, 30000);
