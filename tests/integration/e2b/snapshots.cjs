// E2B's snapshots and forks through the unmodified SDK (E2B_MODULE, and
// E2B_API_URL, E2B_SANDBOX_URL, E2B_API_KEY as a user sets them): prints
// what it saw as one JSON object for e2b_control_test.cpp to judge.
const { Sandbox, failure, main } = require('./common.cjs');

main(async () => {
  const out = {};
  const made = [];
  const sbx = await Sandbox.create(process.env.TEMPLATE, { timeoutMs: 120000 });
  made.push(sbx);
  try {
    await sbx.files.write('/tmp/state.txt', 'state before fork');
    await sbx.commands.run('echo started > /tmp/bg; sleep 600', { background: true });

    // fork: each its own sandbox, in the source's state, independent of it.
    const forks = await sbx.fork({ count: 2, timeoutMs: 60000 });
    made.push(...forks.filter((f) => f instanceof Sandbox));
    out.forks = forks.map((f) => (f instanceof Sandbox ? 'sandbox' : `${f.constructor.name}: ${f.message}`));
    const [a, b] = forks;
    out.forkIds = new Set([sbx.sandboxId, a.sandboxId, b.sandboxId]).size;
    out.forkRead = await a.files.read('/tmp/state.txt');
    await a.files.write('/tmp/state.txt', 'modified in fork');
    out.sourceAfter = await sbx.files.read('/tmp/state.txt');
    out.otherFork = await b.files.read('/tmp/state.txt');
    out.forkRuns = (await a.commands.run('echo hi from $(hostname)')).stdout;
    const info = await a.getInfo();
    out.forkLifetime = Math.round((info.endAt - Date.now()) / 1000);
    out.sourceRunning = await sbx.isRunning();
    const byId = await Sandbox.fork(sbx.sandboxId);
    made.push(...byId.filter((f) => f instanceof Sandbox));
    out.forkById = byId.length === 1 && byId[0] instanceof Sandbox && (await byId[0].isRunning());
    out.forkOfFork = (await a.fork())[0];
    if (out.forkOfFork instanceof Sandbox) {
      made.push(out.forkOfFork);
      out.forkOfFork = await out.forkOfFork.files.read('/tmp/state.txt');
    }

    // Snapshots: a template of new sandboxes, listed, removed once unused.
    const name = `snap-${process.env.RUN_ID}`;
    const snap = await sbx.createSnapshot({ name });
    out.snapshot = snap;
    out.snapshotAgain = await failure(() => sbx.createSnapshot({ name }));
    out.badName = await failure(() => sbx.createSnapshot({ name: 'Not A Name!' }));
    const fromSnap = await Sandbox.create(snap.snapshotId, { timeoutMs: 60000 });
    made.push(fromSnap);
    out.fromSnapshot = await fromSnap.files.read('/tmp/state.txt');
    out.fromSnapshotTemplate = (await fromSnap.getInfo()).templateId;
    out.listed = (await sbx.listSnapshots().nextItems()).map((s) => s.snapshotId);
    out.listedByName = (await Sandbox.listSnapshots({ name }).nextItems()).length;
    out.deleteInUse = await failure(() => Sandbox.deleteSnapshot(snap.snapshotId));
    await fromSnap.kill();
    out.deleted = await Sandbox.deleteSnapshot(snap.snapshotId);
    out.deletedAgain = await Sandbox.deleteSnapshot(snap.snapshotId);
    out.fromDeleted = await failure(() => Sandbox.create(snap.snapshotId));

    // Bad input: E2B's SDK checks count < 1 itself; the door checks the rest.
    const post = (path, body) =>
      fetch(process.env.E2B_API_URL + path, {
        method: 'POST',
        headers: { 'X-API-KEY': process.env.E2B_API_KEY, 'Content-Type': 'application/json' },
        body: JSON.stringify(body),
      }).then(async (r) => [r.status, await r.text()]);
    out.tooMany = await post(`/sandboxes/${sbx.sandboxId}/fork`, { count: 101 });
    out.countNotNumber = await post(`/sandboxes/${sbx.sandboxId}/fork`, { count: 'two' });
    out.forkUnknown = await failure(() => Sandbox.fork('e0000000000000000000'));
    await sbx.kill();
    out.forkKilled = await failure(() => sbx.fork());
  } finally {
    await Promise.all(made.map((s) => s.kill().catch(() => {})));
    out.made = made.map((s) => s.sandboxId);
  }
  return out;
});
