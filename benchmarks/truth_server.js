// A fast OpenAI-compatible streaming server whose truth is known, for benchmarks/peers.py.
//
//   node benchmarks/truth_server.js --port 8100 --ttft 0.02 --itl 0.01
//
// Every completion streams max_tokens one-token chunks: the first `ttft` seconds after the
// request arrived, the next ones `itl` apart (deadlines from the arrival, so a late timer does
// not push the later chunks back). It records when each request arrived and when each chunk
// was handed to the socket, on CLOCK_MONOTONIC (process.hrtime), the clock Python's
// time.perf_counter reads on Linux: GET /truth returns {by_request: {id: {arrival, chunks}}} in
// seconds; POST /truth/reset clears it. Not Python: one Node process streams thousands of
// chunks a second with little CPU, so at 512 streams the server is not what runs late.
"use strict";
const http = require("http");

const args = Object.fromEntries(
  process.argv.slice(2).reduce((pairs, a, i, all) => (a.startsWith("--") ? [...pairs, [a.slice(2), all[i + 1]]] : pairs), []),
);
const PORT = Number(args.port || 8100);
const TTFT = Number(args.ttft || 0.02);
const ITL = Number(args.itl || 0.01);
const MODEL = args.model || "tiny";

const now = () => Number(process.hrtime.bigint()) / 1e9; // seconds, CLOCK_MONOTONIC
let truth = { by_request: {}, requests: 0, max_in_flight: 0 };
let inFlight = 0;
let counter = 0;

function json(res, code, body) {
  const data = JSON.stringify(body);
  res.writeHead(code, { "Content-Type": "application/json", "Content-Length": Buffer.byteLength(data) });
  res.end(data);
}

function stream(req, res, body, arrival) {
  const chat = req.url.startsWith("/v1/chat/");
  const n = Number(body.max_tokens || body.max_completion_tokens || 16);
  const id = req.headers["x-request-id"] || `r${counter++}`;
  const created = Math.floor(Date.now() / 1000);
  const chunks = [];
  truth.by_request[id] = { arrival, chunks };
  truth.requests += 1;
  inFlight += 1;
  truth.max_in_flight = Math.max(truth.max_in_flight, inFlight);
  req.socket.setNoDelay(true);
  res.writeHead(200, { "Content-Type": "text/event-stream", "Cache-Control": "no-cache" });
  const object = chat ? "chat.completion.chunk" : "text_completion";
  const usage = (k) => ({ prompt_tokens: 32, completion_tokens: k, total_tokens: 32 + k });
  const wantUsage = body.stream_options && body.stream_options.include_usage;
  let sent = 0;
  let due = arrival + TTFT;
  let closed = false;
  res.on("close", () => {
    if (!closed) {
      closed = true;
      inFlight -= 1;
    }
  });
  const next = () => {
    if (closed) return;
    const wait = due - now();
    if (wait > 0.0005) {
      setTimeout(next, Math.max(1, Math.floor(wait * 1000)));
      return;
    }
    while (wait > 0 && due - now() > 0) {} // the last fraction of a millisecond: never early
    sent += 1;
    const last = sent >= n;
    const choice = chat
      ? { index: 0, delta: { content: " a" }, finish_reason: last ? "length" : null }
      : { index: 0, text: " a", logprobs: null, finish_reason: last ? "length" : null };
    const chunk = { id: `cmpl-${id}`, object, created, model: MODEL, choices: [choice] };
    if (body.stream_options && body.stream_options.continuous_usage_stats) chunk.usage = usage(sent);
    chunks.push(now());
    res.write(`data: ${JSON.stringify(chunk)}\n\n`);
    if (!last) {
      due += ITL;
      next();
      return;
    }
    if (wantUsage) res.write(`data: ${JSON.stringify({ id: `cmpl-${id}`, object, created, model: MODEL, choices: [], usage: usage(sent) })}\n\n`);
    res.write("data: [DONE]\n\n");
    closed = true;
    inFlight -= 1;
    res.end();
  };
  next();
}

const server = http.createServer((req, res) => {
  const arrival = now();
  if (req.method === "GET" && (req.url === "/health" || req.url === "/ping")) return res.end("ok");
  if (req.method === "GET" && req.url === "/v1/models")
    return json(res, 200, { object: "list", data: [{ id: MODEL, object: "model", owned_by: "truth", max_model_len: 4096 }] });
  if (req.method === "GET" && req.url === "/truth") return json(res, 200, truth);
  if (req.method === "POST" && req.url === "/truth/reset") {
    truth = { by_request: {}, requests: 0, max_in_flight: 0 };
    return res.end("ok");
  }
  if (req.method === "POST" && (req.url === "/v1/completions" || req.url === "/v1/chat/completions")) {
    const parts = [];
    req.on("data", (d) => parts.push(d));
    req.on("end", () => {
      let body;
      try {
        body = JSON.parse(Buffer.concat(parts).toString() || "{}");
      } catch (e) {
        return json(res, 400, { error: { message: String(e) } });
      }
      if (!body.stream) {
        const n = Number(body.max_tokens || 16);
        return json(res, 200, {
          id: "cmpl-x", object: "text_completion", model: MODEL,
          choices: [{ index: 0, text: " a".repeat(n), finish_reason: "length" }],
          usage: { prompt_tokens: 32, completion_tokens: n, total_tokens: 32 + n },
        });
      }
      stream(req, res, body, arrival);
    });
    return;
  }
  json(res, 404, { error: { message: `no route ${req.method} ${req.url}` } });
});
server.keepAliveTimeout = 120000;
server.headersTimeout = 130000;
server.listen(PORT, "127.0.0.1", () => console.log(`truth server on 127.0.0.1:${PORT}`));
