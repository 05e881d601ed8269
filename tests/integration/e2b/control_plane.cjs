// Drives dsec's E2B door with the unmodified `e2b` SDK (its module path in
// E2B_MODULE; E2B_API_URL and E2B_API_KEY as a user sets them) and prints
// what it saw as one JSON object, for e2b_control_test.cpp to judge.
const { Sandbox, failure, main } = require('./common.cjs');

main(async () => {
  const out = {};
  const run = process.env.RUN_ID;
  const sbx = await Sandbox.create(process.env.TEMPLATE, { metadata: { run }, timeoutMs: 120000 });
  out.id = sbx.sandboxId;
  const info = await sbx.getInfo();
  out.info = {
    sandboxId: info.sandboxId, templateId: info.templateId, state: info.state, metadata: info.metadata,
    envdVersion: info.envdVersion, lifetime: Math.round((info.endAt - info.startedAt) / 1000),
  };
  await sbx.setTimeout(600000);
  const later = await sbx.getInfo();
  out.extendedBy = Math.round((later.endAt - info.endAt) / 1000);
  const metrics = await sbx.getMetrics();
  out.metrics = metrics.map((m) => ({ ...m, age: Math.round((Date.now() - m.timestamp.getTime()) / 1000) }));
  const hourAgo = new Date(Date.now() - 3600000);
  out.pastMetrics = (await sbx.getMetrics({ start: hourAgo, end: new Date(hourAgo.getTime() + 60000) })).length;
  out.listed = (await Sandbox.list({ query: { metadata: { run } } }).nextItems()).map((s) => s.sandboxId);
  out.othersListed = (await Sandbox.list({ query: { metadata: { run: 'nobody' } } }).nextItems()).length;
  out.running = (await Sandbox.list({ query: { state: ['running'], metadata: { run } } }).nextItems()).length;
  // In order of start across pages (newest first unless asc), and from a time on.
  const second = await Sandbox.create(process.env.TEMPLATE, { metadata: { run }, timeoutMs: 120000 });
  const pages = async (opts) => {
    const p = Sandbox.list({ ...opts, limit: 1, query: { metadata: { run }, ...(opts.query || {}) } });
    const ids = [];
    while (p.hasNext) ids.push(...(await p.nextItems()).map((s) => s.sandboxId));
    return ids;
  };
  out.newestFirst = (await pages({})).join() === [second.sandboxId, sbx.sandboxId].join();
  out.oldestFirst = (await pages({ order: 'asc' })).join() === [sbx.sandboxId, second.sandboxId].join();
  const secondStart = (await second.getInfo()).startedAt;
  out.startedAfter = (await pages({ query: { startedAfter: secondStart } })).join() === second.sandboxId;
  out.badOrder = await fetch(`${process.env.E2B_API_URL}/v2/sandboxes?order=sideways`,
    { headers: { 'X-API-KEY': process.env.E2B_API_KEY } }).then((r) => r.status);
  await second.kill();
  const again = await Sandbox.connect(sbx.sandboxId, { timeoutMs: 60000 });
  out.connected = again.sandboxId;
  out.killed = await Sandbox.kill(sbx.sandboxId);
  out.killedAgain = await Sandbox.kill(sbx.sandboxId);
  out.afterKill = await failure(() => Sandbox.getInfo(sbx.sandboxId));
  // lifecycle: paused at its timeout's end, a call resumes it (autoResume).
  const ap = await Sandbox.create(process.env.TEMPLATE, { timeoutMs: 1000, lifecycle: { onTimeout: 'pause', autoResume: true } });
  await ap.files.write('/tmp/kept', 'kept');
  for (let i = 0; i < 300 && (await ap.getInfo()).state !== 'paused'; i++) await new Promise((r) => setTimeout(r, 100));
  out.autoPaused = (await ap.getInfo()).state;
  out.lifecycle = (await ap.getInfo()).lifecycle;
  out.network = [(await ap.getInfo()).allowInternetAccess, (await ap.getInfo()).network];
  out.autoResumed = (await ap.commands.run('cat /tmp/kept')).stdout;
  out.connectedAfter = (await Sandbox.connect(ap.sandboxId, { timeoutMs: 60000 })).sandboxId === ap.sandboxId;
  out.runningAfter = (await ap.getInfo()).state;
  await ap.kill();
  out.badKey = await failure(() => Sandbox.create(process.env.TEMPLATE, { apiKey: 'e2b_' + '0'.repeat(40) }));
  out.badTemplate = await failure(() => Sandbox.create('no-such-image'));
  out.badKind = await failure(() => Sandbox.create(process.env.TEMPLATE, { metadata: { 'dsec.kind': 'zeppelin' } }));
  return out;
});
