// A Node.js HTTPS client for the live TLS tests: Node's TLS runs OpenSSL over memory BIOs and
// drives a client's handshake from SSL_read/SSL_write, so no syscall happens inside an SSL call.
// Usage: node https_client.js PORT CA_FILE COUNT [per-request]. Prints "ready", waits for a line
// on stdin (the agent attaches meanwhile), then makes COUNT GETs on one keep-alive connection
// (per-request: each on a connection of its own, opened as soon as the last response was read,
// the earlier ones kept open), printing {"path", "status"} per response.
"use strict";
const fs = require("fs");
const https = require("https");
const readline = require("readline");

const [port, caFile, count, mode] = process.argv.slice(2);
const agents = [new https.Agent({ keepAlive: true, maxSockets: 1 })];
const ca = fs.readFileSync(caFile);

function get(path) {
  if (mode === "per-request") agents.push(new https.Agent({ keepAlive: true, maxSockets: 1 }));
  const agent = agents[agents.length - 1];
  return new Promise((resolve, reject) => {
    const request = https.get({ host: "127.0.0.1", port: Number(port), path, ca, agent }, (response) => {
      response.resume();
      response.on("end", () => {
        console.log(JSON.stringify({ path, status: response.statusCode }));
        resolve();
      });
    });
    request.on("error", reject);
  });
}

async function main() {
  console.log("ready");
  const lines = readline.createInterface({ input: process.stdin });
  await new Promise((resolve) => lines.once("line", resolve));
  lines.close();
  for (let i = 0; i < Number(count); i++) {
    await get(i % 5 ? `/items/node-${i}` : `/missing/node-${i}`);
  }
  for (const agent of agents) agent.destroy();
}

main().catch((error) => {
  console.error(error);
  process.exit(1);
});
