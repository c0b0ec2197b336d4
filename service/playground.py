"""GET /: a one-file playground (plain HTML + JS, no build step): prompt or chat, sampling settings, the
streamed answer with live tokens/s. It talks to the same /v1 endpoints as any client."""
from __future__ import annotations

from flask import Blueprint, Response

from .openapi import document

bp = Blueprint("playground", __name__)


@bp.get("/")
@document("The playground page", ok={"description": "HTML", "content": {"text/html": {"schema": {"type": "string"}}}})
def page():
    return Response(PAGE, mimetype="text/html")


PAGE = r"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>ortllm playground</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>
 body { font: 15px/1.45 system-ui, sans-serif; margin: 0; background: #f6f7f9; color: #1d2330; }
 header { padding: 10px 20px; background: #1d2330; color: #fff; display: flex; gap: 16px; align-items: baseline; }
 header b { font-size: 18px; } header span { opacity: .75; font-size: 13px; }
 main { display: grid; grid-template-columns: 260px 1fr; gap: 18px; padding: 18px 20px; }
 fieldset { border: 1px solid #d5d9e0; border-radius: 8px; background: #fff; margin: 0 0 12px; }
 label { display: block; font-size: 13px; margin: 6px 0 2px; color: #505a6b; }
 input, select, textarea { width: 100%; box-sizing: border-box; font: inherit; padding: 5px 7px;
   border: 1px solid #c4cad4; border-radius: 6px; }
 textarea { min-height: 110px; resize: vertical; }
 button { font: inherit; padding: 7px 18px; border-radius: 6px; border: 0; background: #2f6fed; color: #fff;
   cursor: pointer; } button:disabled { background: #9db5e8; } button.secondary { background: #6b7484; }
 #output { white-space: pre-wrap; min-height: 160px; background: #fff; border: 1px solid #d5d9e0; border-radius: 8px;
   padding: 12px; font-family: ui-monospace, monospace; font-size: 14px; }
 #stats { font-size: 13px; color: #505a6b; margin: 6px 0; min-height: 18px; }
 .err { color: #b3261e; }
</style></head>
<body>
<header><b>ortllm playground</b><span id="model">model: …</span><span id="health">health: …</span></header>
<main>
 <aside>
  <fieldset><legend>Mode</legend>
   <label for="adapter">model / adapter</label><select id="adapter"><option value="">base model</option></select>
   <select id="mode"><option value="chat">chat</option><option value="completion">completion</option></select>
   <label for="system">system message (chat)</label><input id="system" placeholder="optional">
  </fieldset>
  <fieldset><legend>Sampling</legend>
   <label for="max_tokens">max_tokens</label><input id="max_tokens" type="number" value="128" min="1">
   <label for="temperature">temperature (0 = greedy)</label><input id="temperature" type="number" value="0" step="0.1" min="0" max="2">
   <label for="top_p">top_p</label><input id="top_p" type="number" value="1" step="0.05" min="0.01" max="1">
   <label for="seed">seed</label><input id="seed" type="number" placeholder="none">
   <label for="stop">stop (comma-separated)</label><input id="stop" placeholder="none">
  </fieldset>
  <fieldset><legend>Server</legend>
   <label for="api_key">API key</label><input id="api_key" type="password" placeholder="if the server needs one">
  </fieldset>
 </aside>
 <section>
  <label for="prompt">prompt</label>
  <textarea id="prompt" placeholder="Ask something…"></textarea>
  <p><button id="send">Send</button> <button id="stop_btn" class="secondary" disabled>Stop</button></p>
  <div id="stats"></div>
  <div id="output"></div>
 </section>
</main>
<script>
const $ = (id) => document.getElementById(id);
let controller = null;

function headers() {
  const h = {"Content-Type": "application/json"};
  if ($("api_key").value) h["Authorization"] = "Bearer " + $("api_key").value;
  return h;
}

async function refresh() {
  try { const r = await fetch("/health"); const j = await r.json(); $("health").textContent = "health: " + j.status;
        if (j.model) $("model").textContent = "model: " + j.model; } catch (e) { $("health").textContent = "health: down"; }
  try {   // adapters are the models with a parent
    const r = await fetch("/v1/models", {headers: headers()}); const j = await r.json();
    const pick = $("adapter"), chosen = pick.value;
    pick.replaceChildren(new Option("base model", ""));
    for (const m of (j.data || []).filter(m => m.parent)) pick.add(new Option(m.id, m.id));
    pick.value = [...pick.options].some(o => o.value === chosen) ? chosen : "";
  } catch (e) { /* health shows the state */ }
}

function body() {
  const b = {max_tokens: +$("max_tokens").value || 128, temperature: +$("temperature").value,
             top_p: +$("top_p").value || 1, stream: true, stream_options: {include_usage: true}};
  if ($("seed").value !== "") b.seed = +$("seed").value;
  if ($("adapter").value) b.model = $("adapter").value;
  const stop = $("stop").value.split(",").map(s => s.trim()).filter(Boolean);
  if (stop.length) b.stop = stop;
  if ($("mode").value === "chat") {
    b.messages = [];
    if ($("system").value) b.messages.push({role: "system", content: $("system").value});
    b.messages.push({role: "user", content: $("prompt").value});
  } else b.prompt = $("prompt").value;
  return b;
}

async function send() {
  const out = $("output"), stats = $("stats");
  out.textContent = ""; out.classList.remove("err"); stats.textContent = "waiting…";
  $("send").disabled = true; $("stop_btn").disabled = false;
  controller = new AbortController();
  const chat = $("mode").value === "chat";
  const t0 = performance.now(); let tFirst = null, pieces = 0, usage = null;
  const show = () => {
    const now = performance.now(), gen = tFirst ? (now - tFirst) / 1000 : 0;
    const rate = gen > 0 && pieces > 1 ? ((pieces - 1) / gen).toFixed(1) : "–";
    const n = usage ? usage.completion_tokens : pieces;
    stats.textContent = `${n} tokens · ${rate} tokens/s · first token ${tFirst ? Math.round(tFirst - t0) + " ms" : "–"}`;
  };
  try {
    const r = await fetch(chat ? "/v1/chat/completions" : "/v1/completions",
                          {method: "POST", headers: headers(), body: JSON.stringify(body()), signal: controller.signal});
    if (!r.ok) { const j = await r.json().catch(() => ({error: {message: r.statusText}}));
                 throw new Error(`${r.status}: ${j.error ? j.error.message : r.statusText}`); }
    const reader = r.body.getReader(), dec = new TextDecoder(); let buf = "";
    for (;;) {
      const {value, done} = await reader.read(); if (done) break;
      buf += dec.decode(value, {stream: true});
      let i;
      while ((i = buf.indexOf("\n\n")) >= 0) {
        const line = buf.slice(0, i).trim(); buf = buf.slice(i + 2);
        if (!line.startsWith("data:")) continue;
        const data = line.slice(5).trim(); if (data === "[DONE]") continue;
        const j = JSON.parse(data);
        if (j.error) throw new Error(j.error.message);
        if (j.usage) usage = j.usage;
        const c = j.choices && j.choices[0]; if (!c) continue;
        const piece = chat ? (c.delta && c.delta.content) : c.text;
        if (piece) { if (tFirst === null) tFirst = performance.now(); pieces++; out.textContent += piece; }
      }
      show();
    }
    show();
  } catch (e) {
    if (e.name !== "AbortError") { out.classList.add("err"); out.textContent += (out.textContent ? "\n" : "") + e.message; }
  } finally { $("send").disabled = false; $("stop_btn").disabled = true; controller = null; refresh(); }
}

$("send").addEventListener("click", send);
$("stop_btn").addEventListener("click", () => controller && controller.abort());
$("prompt").addEventListener("keydown", (e) => { if (e.key === "Enter" && (e.ctrlKey || e.metaKey)) send(); });
refresh();
</script>
</body></html>
"""
