// Helpers the dashboard's pages share.
"use strict";

function esc(value) {
  return String(value ?? "").replace(/[&<>"']/g, c => ({"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;"}[c]));
}

function number(value, digits = 4) {
  if (value === null || value === undefined) return "-";
  return typeof value === "number" && !Number.isInteger(value) ? value.toPrecision(digits) : String(value);
}

function age(timestamp) {
  if (!timestamp) return "";
  const seconds = Math.max(0, (Date.now() - Date.parse(timestamp)) / 1000);
  if (seconds < 120) return `${Math.round(seconds)}s`;
  if (seconds < 7200) return `${Math.round(seconds / 60)}m`;
  if (seconds < 172800) return `${Math.round(seconds / 3600)}h`;
  return `${Math.round(seconds / 86400)}d`;
}

function progressCell(row) {
  if (row.percent === null || row.percent === undefined) return row.step !== null && row.step !== undefined ? `step ${esc(row.step)}` : "";
  const left = row.remaining ? ` <span class="muted">${esc(row.remaining)} left</span>` : "";
  return `<span class="bar"><span style="width:${Math.min(100, Math.max(0, row.percent))}%"></span></span> ${esc(number(row.percent, 3))}%${left}`;
}

// GET a JSON API; the API server's refusal (or S3's error) is shown in the page's error box.
async function getJson(url, errorBox) {
  const response = await fetch(url);
  const body = await response.json().catch(() => ({error: `${response.status} ${response.statusText}`}));
  if (errorBox) errorBox.textContent = body.error || "";
  if (!response.ok || body.error) throw new Error(body.error || response.statusText);
  return body;
}

function jobQuery(namespace, name, results) {
  const query = new URLSearchParams({namespace, name});
  if (results) query.set("results", results);
  return query.toString();
}
