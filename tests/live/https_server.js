// A Node.js HTTPS server for the live TLS tests: its TLS runs OpenSSL over memory BIOs, so no
// syscall happens inside an SSL call, and one thread serves every connection.
// Usage: node https_server.js PORT_FILE CERT KEY. Answers every GET with {"path": ...}; writes the
// port it listens on (127.0.0.1) to PORT_FILE.
"use strict";
const fs = require("fs");
const https = require("https");

const [portFile, cert, key] = process.argv.slice(2);
const server = https.createServer({ cert: fs.readFileSync(cert), key: fs.readFileSync(key) }, (request, response) => {
  const body = JSON.stringify({ path: request.url });
  response.writeHead(200, { "Content-Type": "application/json", "Content-Length": Buffer.byteLength(body) });
  response.end(body);
});
server.listen(0, "127.0.0.1", () => fs.writeFileSync(portFile, String(server.address().port)));
