// The jobs page: a row per DDPJob of the namespace (or all), sent again by the server at each change.
"use strict";

const params = new URLSearchParams(location.search);
let source = null;

function rowHtml(row) {
  const link = `/job?${jobQuery(row.namespace, row.name, row.results)}`;
  const why = row.reason ? `${esc(row.reason)}${row.message ? `<div class="muted">${esc(row.message)}</div>` : ""}` : "";
  return `<tr data-job="${esc(row.namespace)}/${esc(row.name)}">
    <td>${esc(row.namespace)}</td><td><a href="${esc(link)}">${esc(row.name)}</a></td>
    <td class="phase phase-${esc(row.phase)}">${esc(row.phase)}</td><td class="ready">${esc(row.ready)}</td>
    <td class="restarts">${esc(row.restarts ?? "")}</td><td class="progress">${progressCell(row)}</td>
    <td>${esc(number(row.epoch, 3))}</td><td class="step">${esc(row.step ?? "-")}</td><td class="loss">${esc(number(row.loss))}</td>
    <td class="reason">${why}</td><td>${esc(age(row.created))}</td></tr>`;
}

function show(namespace) {
  if (source) source.close();
  document.getElementById("namespace").value = namespace;
  source = new EventSource(`/api/jobs/events?namespace=${encodeURIComponent(namespace)}`);
  source.onmessage = message => {
    const body = JSON.parse(message.data);
    document.getElementById("error").textContent = body.error ? `the Kubernetes API answered ${body.error}` : "";
    document.querySelector("#jobs tbody").innerHTML = body.jobs.map(rowHtml).join("");
    document.getElementById("count").textContent = `(${body.jobs.length})`;
  };
  loadDeleted(namespace);
}

async function loadDeleted(namespace) {
  const box = document.getElementById("deleted-error");
  try {
    const body = await getJson(`/api/deleted?namespace=${encodeURIComponent(namespace)}`, box);
    box.textContent = body.errors.join("\n");
    document.querySelector("#deleted tbody").innerHTML = body.jobs.map(row =>
      `<tr data-job="${esc(row.namespace)}/${esc(row.name)}"><td>${esc(row.namespace)}</td>
       <td><a href="/job?${esc(jobQuery(row.namespace, row.name, row.results))}">${esc(row.name)}</a></td>
       <td class="muted">${esc(row.results)}</td></tr>`).join("");
  } catch (error) { /* said in the box */ }
}

document.getElementById("show").onclick = () => {
  const namespace = document.getElementById("namespace").value.trim() || "all";
  history.replaceState(null, "", `/?namespace=${encodeURIComponent(namespace)}`);
  show(namespace);
};

(async () => {
  const config = await getJson("/api/config");
  show(params.get("namespace") || config.namespace);
  setInterval(() => loadDeleted(document.getElementById("namespace").value || "all"), 30000);
})();
