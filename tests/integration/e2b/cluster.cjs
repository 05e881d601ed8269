// The unmodified SDK against a controller's E2B door: sandboxes made
// there land on its nodes, and every call (commands, files, fork, kill)
// reaches each one's node; prints what it saw as one JSON object.
const { Sandbox, main } = require('./common.cjs');

main(async () => {
  const out = { ids: [], echoed: [], nodes: [] };
  const run = process.env.RUN_ID;
  const made = [];
  // The node each is on: the record's clientID (the SDK's getInfo leaves it out).
  const nodeOf = (id) => fetch(`${process.env.E2B_API_URL}/sandboxes/${id}`, { headers: { 'X-API-KEY': process.env.E2B_API_KEY } })
    .then((r) => r.json()).then((j) => j.clientID);
  try {
    for (let i = 0; i < 6; i++) {
      const s = await Sandbox.create(process.env.TEMPLATE, { timeoutMs: 120000, metadata: { run } });
      made.push(s);
      out.ids.push(s.sandboxId);
      await s.files.write('/tmp/who', s.sandboxId);
      out.echoed.push((await s.commands.run('cat /tmp/who', { user: 'root' })).stdout);
      out.nodes.push(await nodeOf(s.sandboxId));
    }
    const fork = (await made[0].fork())[0];
    made.push(fork);
    out.fork = fork.sandboxId;
    out.forkRead = await fork.files.read('/tmp/who');
    out.forkNode = await nodeOf(fork.sandboxId);
    out.listed = (await Sandbox.list({ query: { metadata: { run } } }).nextItems()).length;
  } finally {
    out.killed = (await Promise.all(made.map((s) => s.kill().catch(() => false)))).filter((k) => k).length;
  }
  return out;
});
