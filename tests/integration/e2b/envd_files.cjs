// envd's REST calls through dsec's E2B door (E2B_SANDBOX_URL at the same
// port): files written and read back by the unmodified `e2b` SDK, and the
// sandbox's health; prints what it saw as one JSON object.
const { Sandbox, failure, main } = require('./common.cjs');

main(async () => {
  const out = {};
  const sbx = await Sandbox.create(process.env.TEMPLATE, { timeoutMs: 120000 });
  out.id = sbx.sandboxId;
  try {
    out.written = await sbx.files.write('/tmp/e2b/deep/a.txt', 'hello from e2b\n');
    out.read = await sbx.files.read('/tmp/e2b/deep/a.txt');
    const bytes = new Uint8Array(70000).map((_, i) => (i * 7) % 256);
    await sbx.files.write([{ path: '/tmp/e2b/b.bin', data: bytes }, { path: '/tmp/e2b/c.txt', data: 'c' }]);
    const back = await sbx.files.read('/tmp/e2b/b.bin', { format: 'bytes' });
    out.binarySame = back.length === bytes.length && back.every((v, i) => v === bytes[i]);
    out.c = await sbx.files.read('/tmp/e2b/c.txt');
    // envd 0.6.2: file metadata, kept as the file's user.e2b.* extended attributes.
    const metadata = { author: 'mish', purpose: 'upload' };
    out.metaWritten = (await sbx.files.write('/tmp/e2b/meta.txt', 'm', { metadata })).metadata;
    out.metaInfo = (await sbx.files.getInfo('/tmp/e2b/meta.txt')).metadata;
    out.metaListed = (await sbx.files.list('/tmp/e2b')).find((e) => e.name === 'meta.txt').metadata;
    out.metaRenamed = (await sbx.files.rename('/tmp/e2b/meta.txt', '/tmp/e2b/meta2.txt')).metadata;
    out.metaOverwritten = [(await sbx.files.write('/tmp/e2b/meta2.txt', 'again')).metadata ?? null,
      (await sbx.files.getInfo('/tmp/e2b/meta2.txt')).metadata ?? null];
    await sbx.commands.run(`python3 -c "import os; os.setxattr('/tmp/e2b/c.txt', 'user.e2b.by', b'hand')"`, { user: 'root' });
    out.metaByHand = (await sbx.files.getInfo('/tmp/e2b/c.txt')).metadata;
    out.noMeta = (await sbx.files.getInfo('/tmp/e2b/deep/a.txt')).metadata ?? null;
    // envd 0.5.7: raw (octet-stream) uploads, gzip-compressed or streamed.
    await sbx.files.write('/tmp/e2b/z.txt', 'zipped '.repeat(10000), { gzip: true });
    out.gzipSame = (await sbx.files.read('/tmp/e2b/z.txt')) === 'zipped '.repeat(10000);
    const stream = new ReadableStream({
      start(c) { c.enqueue(new TextEncoder().encode('part1 ')); c.enqueue(new TextEncoder().encode('part2')); c.close(); },
    });
    await sbx.files.write('/tmp/e2b/s.txt', stream);
    out.streamed = await sbx.files.read('/tmp/e2b/s.txt');
    const zlib = require('zlib');
    const twoMembers = Buffer.concat([zlib.gzipSync('first '), zlib.gzipSync('second')]);  // as `cat a.gz b.gz`
    out.twoMembers = await fetch(`${process.env.E2B_SANDBOX_URL}/files?path=/tmp/e2b/two.txt`, {
      method: 'POST', body: twoMembers,
      headers: { 'Content-Type': 'application/octet-stream', 'Content-Encoding': 'gzip',
                 'E2b-Sandbox-Id': sbx.sandboxId, 'X-Access-Token': sbx.envdAccessToken ?? '' },
    }).then(async (r) => [r.status, await sbx.files.read('/tmp/e2b/two.txt')]);
    out.badGzip = await fetch(`${process.env.E2B_SANDBOX_URL}/files?path=/tmp/e2b/bad`, {
      method: 'POST', body: 'not gzip at all',
      headers: { 'Content-Type': 'application/octet-stream', 'Content-Encoding': 'gzip',
                 'E2b-Sandbox-Id': sbx.sandboxId, 'X-Access-Token': sbx.envdAccessToken ?? '' },
    }).then(async (r) => [r.status, await r.text()]);
    out.missing = await failure(() => sbx.files.read('/tmp/e2b/none'));
    out.running = await sbx.isRunning();
    // Another sandbox's token does not open this one's files.
    const other = await Sandbox.create(process.env.TEMPLATE, { timeoutMs: 60000 });
    out.crossToken = await failure(() =>
      fetch(`${process.env.E2B_SANDBOX_URL}/files?path=/tmp/e2b/c.txt`, {
        headers: { 'E2b-Sandbox-Id': sbx.sandboxId, 'X-Access-Token': other.envdAccessToken ?? 'none' },
      }).then((r) => { if (r.status !== 200) throw new Error(`status ${r.status}`); }));
    await other.kill();
    // Signed URLs (downloadUrl, uploadUrl): fetched without headers, as a browser would.
    const down = await sbx.downloadUrl('/tmp/e2b/c.txt', { useSignatureExpiration: 600 });
    out.signedRead = await fetch(down).then(async (r) => [r.status, await r.text()]);
    const form = () => { const f = new FormData(); f.append('file', 'uploaded'); return f; };
    const up = await sbx.uploadUrl('/tmp/e2b/up.txt');
    out.signedWrite = [await fetch(up, { method: 'POST', body: form() }).then((r) => r.status),
      await sbx.files.read('/tmp/e2b/up.txt')];
    const expired = await sbx.downloadUrl('/tmp/e2b/c.txt', { useSignatureExpiration: -10 });
    out.signedExpired = await fetch(expired).then(async (r) => [r.status, await r.json()]);
    out.signedForged = await fetch(down.replace(/signature=[^&]*/, 'signature=v1_forged')).then((r) => r.status);
    const readOfUp = (await sbx.downloadUrl('/tmp/e2b/up.txt'));
    out.readUrlWrites = await fetch(readOfUp, { method: 'POST', body: form() }).then((r) => r.status);
    out.signedWithId = await fetch(down, { headers: { 'E2b-Sandbox-Id': sbx.sandboxId } }).then((r) => r.status);
    // A service in the sandbox by its port (the sandbox has no network link: its policy is none).
    await sbx.files.write('/tmp/www/hello.txt', 'hello from a port');
    const big = 'x'.repeat(300000);
    await sbx.files.write('/tmp/www/big.txt', big);
    const server = await sbx.commands.run('python3 -m http.server 8000 -d /tmp/www', { background: true, user: 'root' });
    const port = (p, path) => fetch(`${process.env.E2B_SANDBOX_URL}${path}`,
      { headers: { 'E2b-Sandbox-Id': sbx.sandboxId, 'E2b-Sandbox-Port': p } });
    let r = await port('8000', '/hello.txt');
    for (let i = 0; i < 100 && r.status !== 200; i++) {  // until the server listens
      await new Promise((res) => setTimeout(res, 100));
      r = await port('8000', '/hello.txt');
    }
    out.portRead = [r.status, await r.text(), r.headers.get('content-type')];
    out.portBig = (await (await port('8000', '/big.txt')).text()) === big;
    out.portMissing = (await port('8000', '/none.txt')).status;
    const u = new URL(process.env.E2B_SANDBOX_URL);
    out.portByHost = await new Promise((resolve, reject) => {
      require('http').get({ host: u.hostname, port: u.port, path: '/hello.txt', headers: { Host: sbx.getHost(8000) } },
        (res) => { let b = ''; res.on('data', (d) => { b += d; }); res.on('end', () => resolve([res.statusCode, b])); })
        .on('error', reject);
    });
    out.portClosed = await port('8001', '/').then(async (res) => [res.status, await res.json()]);
    await server.kill();
  } finally {
    await sbx.kill();
  }
  out.runningAfterKill = await sbx.isRunning();
  out.portGone = await fetch(process.env.E2B_SANDBOX_URL,
    { headers: { 'E2b-Sandbox-Id': sbx.sandboxId, 'E2b-Sandbox-Port': '8000' } }).then(async (r) => [r.status, (await r.json()).message]);
  return out;
});
