// A busy multiplexed HTTP/2 (h2c) connection, as gRPC and Node services have them: the client
// sends bursts of concurrent requests on one connection, so that each side writes and reads the
// frames of a whole burst in one call (Node's writev: four segments per stream).
//
//   node h2_burst.js serve PORT_FILE          answers GET /items/N with a small JSON body, and
//                                             GET /bytes/N with N bytes (a large download)
//   node h2_burst.js burst PORT ROUNDS SIZE [BODY]
//                                             waits for a line on stdin, then ROUNDS bursts of
//                                             SIZE requests (POSTs of BODY bytes when BODY is
//                                             given); prints one status per request
//   node h2_burst.js flood PORT SECONDS STREAMS [RATE]
//                                             keeps STREAMS GETs in flight for SECONDS, each
//                                             followed by the next as it ends (with RATE, each
//                                             stream on a schedule of RATE / STREAMS calls per
//                                             second); prints {"calls", "seconds", "errors",
//                                             "p50_ms", "p99_ms"} (errors: non-200s and resets)
const http2 = require('http2');
const fs = require('fs');
const [mode, ...args] = process.argv.slice(2);

if (mode === 'serve') {
  const server = http2.createServer();
  server.on('stream', (stream, headers) => {
    const path = headers[':path'];
    if (path.startsWith('/bytes/')) {
      const size = Number(path.slice('/bytes/'.length));
      stream.respond({':status': 200, 'content-type': 'application/octet-stream', 'content-length': size});
      stream.end(Buffer.alloc(size, 98));
      return;
    }
    stream.respond({':status': 200, 'content-type': 'application/json', 'x-path': path});
    stream.end(JSON.stringify({path, padding: 'p'.repeat(120)}));
  });
  server.listen(0, '127.0.0.1', () => {
    fs.writeFileSync(args[0] + '.tmp', String(server.address().port));
    fs.renameSync(args[0] + '.tmp', args[0]);
  });
} else if (mode === 'flood') {
  const [port, seconds, streams, rate] = args.map(Number);
  const client = http2.connect(`http://127.0.0.1:${port}`);
  const latencies = [];
  let errors = 0;
  const one = (n) => new Promise((resolve) => {
    const sent = process.hrtime.bigint();
    const request = client.request({':path': `/items/${n}`});
    request.on('response', (headers) => { if (headers[':status'] !== 200) errors++; });
    request.on('data', () => {});
    request.on('end', () => { latencies.push(Number(process.hrtime.bigint() - sent) / 1e6); resolve(); });
    request.on('error', () => { errors++; resolve(); });
    request.end();
  });
  const start = Date.now(), stop = start + seconds * 1000;
  const interval = rate ? streams * 1000 / rate : 0;  // ms between one stream's calls
  const stream = async (first) => {
    for (let n = first, due = start; Date.now() < stop; n += streams) {
      await one(n);
      due += interval;
      const wait = due - Date.now();
      if (wait > 0) await new Promise((resolve) => setTimeout(resolve, wait));
    }
  };
  Promise.all(Array.from({length: streams}, (_, i) => stream(i))).then(() => {
    const elapsed = (Date.now() - start) / 1000;
    latencies.sort((a, b) => a - b);
    const at = (q) => latencies.length ? latencies[Math.min(latencies.length - 1, Math.floor(q * latencies.length))] : null;
    console.log(JSON.stringify({calls: latencies.length, seconds: elapsed, errors, p50_ms: at(0.5), p99_ms: at(0.99)}));
    client.close();
  });
} else {
  const [port, rounds, size, body] = args.map(Number);
  const get = (client, path) => new Promise((resolve, reject) => {
    const request = client.request(body ? {':path': path, ':method': 'POST'} : {':path': path});
    let status = 0;
    request.on('response', (headers) => { status = headers[':status']; });
    request.on('data', () => {});
    request.on('end', () => resolve(status));
    request.on('error', reject);
    request.end(body ? 'b'.repeat(body) : undefined);
  });
  process.stdin.once('data', async () => {
    const client = http2.connect(`http://127.0.0.1:${port}`);
    const statuses = [];
    for (let round = 0; round < rounds; round++) {
      const burst = [];
      for (let i = 0; i < size; i++) burst.push(get(client, `/items/${round * size + i}`));
      statuses.push(...await Promise.all(burst));
    }
    console.log(statuses.join(' '));
    client.close();
    process.stdin.destroy();
  });
}
