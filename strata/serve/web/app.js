// The strata page: a streaming chat and a monitor, talking to this server's own API. Plain JS, no build step.
"use strict";

const $ = (id) => document.getElementById(id);
const state = { model: null, messages: [], controller: null };

function headers() {
  const h = { "Content-Type": "application/json" };
  const key = $("api-key").value.trim();
  if (key) h["Authorization"] = "Bearer " + key;
  return h;
}

$("api-key").value = localStorage.getItem("strata-api-key") || "";
$("api-key").addEventListener("change", () => localStorage.setItem("strata-api-key", $("api-key").value.trim()));

for (const tab of document.querySelectorAll(".tab")) {
  tab.addEventListener("click", () => {
    for (const t of document.querySelectorAll(".tab")) t.classList.toggle("active", t === tab);
    for (const p of document.querySelectorAll(".panel")) p.classList.toggle("hidden", p.id !== tab.dataset.panel);
  });
}

function bubble(role, text) {
  const div = document.createElement("div");
  div.className = "msg " + role;
  div.textContent = text;
  $("messages").appendChild(div);
  div.scrollIntoView({ block: "end" });
  return div;
}

// Server-sent events from a fetch body: yields the data of each event; comments (keep-alives) are skipped.
async function* sseData(response) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += decoder.decode(value, { stream: true }).replace(/\r\n/g, "\n");
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const block = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      const data = block.split("\n").filter((l) => l.startsWith("data:")).map((l) => l.slice(5).replace(/^ /, ""));
      if (data.length) yield data.join("\n");
    }
  }
}

async function send(text) {
  state.messages.push({ role: "user", content: text });
  bubble("user", text);
  const out = bubble("assistant", "");
  const controller = new AbortController();
  state.controller = controller;
  $("send").disabled = true;
  $("stop").disabled = false;
  $("chat-status").textContent = "waiting for the model...";
  let reply = "", thought = "", thinking = null;  // the model's thinking goes in its own bubble, above the reply
  try {
    const response = await fetch("/v1/chat/completions", {
      method: "POST", headers: headers(), signal: controller.signal,
      body: JSON.stringify({
        model: state.model, messages: state.messages, stream: true,
        stream_options: { include_usage: true },
        max_tokens: parseInt($("max-tokens").value, 10) || 512,
        temperature: parseFloat($("temperature").value),
        reasoning_effort: $("thinking").checked ? "medium" : "none",
      }),
    });
    if (!response.ok) {
      const body = await response.json().catch(() => ({}));
      throw new Error((body.error && body.error.message) || response.statusText);
    }
    for await (const data of sseData(response)) {
      // Stop at once: events already received would otherwise be drawn first, each a redraw of the whole reply (on a
      // busy machine the page said "generating..." for seconds after Stop).
      if (controller.signal.aborted) throw new DOMException("stopped", "AbortError");
      if (data === "[DONE]") break;
      const event = JSON.parse(data);
      if (event.error) throw new Error(event.error.message);
      if (event.usage) {
        const u = event.usage;
        $("chat-status").textContent = `${u.prompt_tokens} prompt tokens (${u.prompt_tokens_details.cached_tokens} ` +
          `from cache), ${u.completion_tokens} generated`;
      }
      for (const choice of event.choices || []) {
        const delta = choice.delta || {};
        if (delta.reasoning_content) {
          if (!thinking) {
            thinking = bubble("thinking", "");
            $("messages").insertBefore(thinking, out);
          }
          thought += delta.reasoning_content;
          thinking.textContent = thought;
          $("chat-status").textContent = "thinking...";
        }
        if (delta.content) {
          reply += delta.content;
          out.textContent = reply;
          $("chat-status").textContent = "generating...";
        }
      }
    }
  } catch (error) {
    if (error.name === "AbortError") {
      $("chat-status").textContent = "stopped";
    } else {
      out.className = "msg error";
      out.textContent = "error: " + error.message;
      $("chat-status").textContent = "";
    }
  } finally {
    state.messages.push({ role: "assistant", content: reply });
    state.controller = null;
    $("send").disabled = false;
    $("stop").disabled = true;
  }
}

$("composer").addEventListener("submit", (e) => {
  e.preventDefault();
  const text = $("prompt").value.trim();
  if (!text || state.controller) return;
  $("prompt").value = "";
  send(text);
});
$("prompt").addEventListener("keydown", (e) => {
  if (e.key === "Enter" && !e.shiftKey) { e.preventDefault(); $("composer").requestSubmit(); }
});
$("stop").addEventListener("click", () => state.controller && state.controller.abort());
$("clear").addEventListener("click", () => { state.messages = []; $("messages").textContent = ""; });

function bytes(n) {
  if (!n) return "-";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return n.toFixed(i ? 1 : 0) + " " + units[i];
}
const rate = (x) => (x ? x.toFixed(1) : "-");

async function poll() {
  try {
    const response = await fetch("/monitor", { headers: headers() });
    if (!response.ok) throw new Error(response.status === 401 ? "API key needed" : response.statusText);
    const m = await response.json();
    $("m-state").textContent = m.running ? "running" : "idle";
    const c = m.current;
    $("m-current").textContent = c
      ? `${c.kind}: ${c.phase === "prompt" ? "reading the prompt" + (c.prompt_to_read ? ` (${c.prompt_read} / ` +
        `${c.prompt_to_read})` : "") : "generating"}, ${c.prompt_tokens} prompt ` +
        `tokens, ${c.generated} / ${c.max_tokens} generated, ${c.elapsed_seconds.toFixed(1)} s`
      : "-";
    $("m-queue").textContent = m.queue_length;
    $("m-prompt-tps").textContent = rate(m.last.prompt_tokens_per_second);
    $("m-decode-tps").textContent = rate(m.last.decode_tokens_per_second);
    const t = m.totals;
    $("m-requests").textContent = `${t.requests} (${t.rejected} refused, ${t.cancelled} cancelled)`;
    $("m-generated").textContent = m.totals.generated_tokens;
    $("m-prompt").textContent = `${m.totals.prompt_tokens} (${m.totals.cached_tokens})`;
    $("m-hit-rate").textContent = m.expert_cache_hit_rate === null ? "- (experts all resident)"
      : (100 * m.expert_cache_hit_rate).toFixed(1) + " %";
    $("m-checkpoints").textContent = `${m.checkpoints.count} (${bytes(m.checkpoints.bytes)})`;
    const gpu = m.memory.gpu;
    $("m-gpu").textContent = gpu ? `${bytes(gpu.allocated)} / ${bytes(gpu.total)}` : "- (no GPU)";
    $("m-rss").textContent = bytes(m.memory.process_rss_bytes);
    $("m-host").textContent = `${bytes(m.memory.host_available_bytes)} of ${bytes(m.memory.host_total_bytes)}`;
    $("m-uptime").textContent = Math.round(m.uptime_seconds) + " s";
    $("monitor-status").textContent = "updated " + new Date().toLocaleTimeString();
  } catch (error) {
    $("monitor-status").textContent = "monitor: " + error.message;
  }
}

fetch("/health").then((r) => r.json()).then((h) => {
  state.model = h.model;
  $("model-name").textContent = h.model;
});
poll();
setInterval(poll, 1000);
