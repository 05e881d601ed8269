// E2B's egress settings through the unmodified SDK against a dsecd whose
// sandboxes reach a test "internet" (198.51.100.2 and .3, port 80; run
// from net_kinds_test in dsecd's network namespace): prints what each
// sandbox could connect to, as one JSON object.
const { Sandbox, failure, main } = require('./common.cjs');

// "ok" or the Python exception's name, from inside the sandbox (as root:
// the test image has no user `user`).
async function reach(sbx, ip) {
  const py = `import socket\ntry:\n socket.create_connection(('${ip}', 80), 3).close(); print('ok')\n` +
    `except OSError as e:\n print(type(e).__name__)`;
  await sbx.files.write('/tmp/reach.py', py, { user: 'root' });
  return (await sbx.commands.run('python3 /tmp/reach.py', { user: 'root' })).stdout.trim();
}

main(async () => {
  const out = {};
  const made = [];
  const T = process.env.TEMPLATE;
  const make = async (opts) => {
    const s = await Sandbox.create(T, { timeoutMs: 120000, ...opts });
    made.push(s);
    return s;
  };
  try {
    const listed = await make({ network: { denyOut: ['0.0.0.0/0'], allowOut: ['198.51.100.2'] } });
    out.listed = [await reach(listed, '198.51.100.2'), await reach(listed, '198.51.100.3')];
    const closed = await make({ allowInternetAccess: false, network: { allowOut: ['198.51.100.3'] } });
    out.closed = [await reach(closed, '198.51.100.2'), await reach(closed, '198.51.100.3')];
    await listed.updateNetwork({ denyOut: ['0.0.0.0/0'], allowOut: ['198.51.100.3'] });
    out.updated = [await reach(listed, '198.51.100.2'), await reach(listed, '198.51.100.3')];
    const dflt = await make({});
    out.default = [await reach(dflt, '198.51.100.2'), await reach(dflt, '198.51.100.3')];
    out.updateUnlinked = await failure(() => dflt.updateNetwork({ denyOut: ['0.0.0.0/0'], allowOut: ['198.51.100.2'] }));
    out.denySome = await failure(() => make({ network: { denyOut: ['198.51.100.2'] } }));
    out.transforms = await failure(() => make({ network: { rules: { 'x.test': [{ transform: { headers: { a: 'b' } } }] } } }));
    out.everything = await failure(() => make({ network: { denyOut: ['0.0.0.0/0'], allowOut: ['0.0.0.0/0'] } }));
    out.badEntry = await failure(() => make({ network: { denyOut: ['0.0.0.0/0'], allowOut: ['198.51.100.0/33'] } }));
  } finally {
    await Promise.all(made.map((s) => s.kill().catch(() => {})));
  }
  return out;
});
